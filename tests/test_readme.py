"""The README and docs/ stay true: .ci/run runs exactly the README's test command, every file and script
they name exists, every link resolves, nothing points outside the repository."""
from __future__ import annotations

import re

import pytest

from tests.paths import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PATH = re.compile(r"(?<![\w/.-])((?:runtime|cute_kernels|profiling|tests|app|weights|structured|docs)/[\w/.-]*\w)")


def commands(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", text, re.S)


def test_ci_runs_the_readme_test_command():
    test_command = next(c for c in commands((REPO / "README.md").read_text()) if "pytest" in c)
    assert test_command.strip() in (REPO / ".ci" / "run").read_text()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_named_path_exists_and_nothing_points_outside(doc):
    text = doc.read_text()
    named = set(PATH.findall(text))
    assert doc.name != "README.md" or len(named) >= 20, f"the path pattern found only {sorted(named)}"
    missing = sorted({p for p in named if "*" not in p and not (REPO / p).exists()
                      and not (REPO / p).with_suffix("").exists() and not p.startswith("profiling/out")})
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"
    links = re.findall(r"\]\(([^)#]+)\)", text)
    broken = [link for link in links if not link.startswith("http") and not (doc.parent / link).exists()]
    assert not broken, f"{doc.name} links to nothing: {broken}"
    assert "shared/" not in text and "../" not in text.replace("](../", ""), f"{doc.name} points outside the repo"
