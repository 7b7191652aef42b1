"""The self-distillation prompts (profiling/quality/train_heads.py): instruction templates over topics, and tasks over
the shipped public-domain passages (data/public_domain.txt). A few hundred of each, shuffled by seed;
profiling/benchmarks/bench_spec.py's chat prompts are none of these (its topics are held out)."""
from __future__ import annotations

import os
import random

PASSAGES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "public_domain.txt")

TEMPLATES = (
    "Explain {t} to a ten-year-old.", "What is {t}?", "Give me three facts about {t}.",
    "Write a short poem about {t}.", "Write a short story that involves {t}.", "Why does {t} matter?",
    "List five questions a student might ask about {t}.", "Describe {t} in two sentences.",
    "What are the pros and cons of {t}?", "How would you teach someone about {t}?",
    "Write a haiku about {t}.", "Summarize what you know about {t}.", "Tell me a joke about {t}.",
    "What is a common misconception about {t}?", "Write a friendly email inviting a friend to learn about {t}.",
    "Compare {t} with something from everyday life.", "Give a step-by-step guide related to {t}.",
    "What would the world be like without {t}?", "Write a product description for a book about {t}.",
    "Describe the history of {t} briefly.", "What are some tips for beginners interested in {t}?",
    "Write a dialogue between two friends talking about {t}.", "Give an example of {t}.",
    "How is {t} used today?", "Write a limerick about {t}.", "What careers involve {t}?",
    "Write a tweet about {t}.", "Explain {t} using an analogy.", "What should everyone know about {t}?",
    "Write a short speech about {t}.",
)
TOPICS = (
    "photosynthesis", "the moon", "volcanoes", "the water cycle", "gravity", "honey bees", "rainbows",
    "the internet", "recycling", "the human heart", "electricity", "the Roman Empire", "chess", "music",
    "friendship", "gardening", "the ocean", "dinosaurs", "computers", "bicycles", "the weather", "sleep",
    "bread baking", "mountains", "libraries", "trains", "the solar system", "exercise", "money", "maps",
    "clocks", "birds", "forests", "kindness", "mathematics", "painting", "coffee", "the seasons",
    "earthquakes", "penguins",
)
PASSAGE_TASKS = (
    "Summarize this passage in one sentence:\n\n{p}", "What is the moral of this passage?\n\n{p}",
    "Rewrite this passage in simple modern English:\n\n{p}", "Who are the characters in this passage?\n\n{p}",
    "Continue this text for a few sentences:\n\n{p}", "Give this passage a title:\n\n{p}",
    "What is the main idea of this passage?\n\n{p}", "Repeat this passage exactly:\n\n{p}",
)


def passages() -> list[str]:
    """The shipped public-domain passages, one per paragraph."""
    with open(PASSAGES_FILE, encoding="utf-8") as f:
        blocks = f.read().split("\n\n")
    return [b.strip() for b in blocks if b.strip() and not b.startswith("#")]


def training_prompts(n: int, seed: int = 0) -> list[str]:
    """n user messages: every template x topic and task x passage, shuffled, cycled if n is larger."""
    pool = [t.format(t=topic) for t in TEMPLATES for topic in TOPICS]
    pool += [task.format(p=p) for task in PASSAGE_TASKS for p in passages()]
    random.Random(seed).shuffle(pool)
    return [pool[i % len(pool)] for i in range(n)]
