"""Engine-wide counters and where each step's time goes."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepTimes:
    """Seconds spent per phase, summed over steps."""

    propose: float = 0.0  # speculative drafting (a draft model's forward passes)
    schedule: float = 0.0
    prepare: float = 0.0  # building the packed input tensors
    forward: float = 0.0
    sample: float = 0.0
    output: float = 0.0  # detokenization, stop checks, output records

    @property
    def total(self) -> float:
        return self.propose + self.schedule + self.prepare + self.forward + self.sample + self.output

    def shares(self) -> dict[str, float]:
        t = self.total or 1.0
        return {k: getattr(self, k) / t for k in ("propose", "schedule", "prepare", "forward", "sample", "output")}


@dataclass
class EngineStats:
    steps: int = 0
    prompt_tokens: int = 0  # prompt tokens received
    computed_prefill_tokens: int = 0  # tokens run through the model in prefill chunks (after cache hits)
    generated_tokens: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})
    spec_proposed: int = 0
    spec_accepted: int = 0
    spec_verify_steps: int = 0  # (sequence, step) pairs that verified drafts
    times: StepTimes = field(default_factory=StepTimes)

    @property
    def spec_acceptance_rate(self) -> float:
        return self.spec_accepted / self.spec_proposed if self.spec_proposed else 0.0

    @property
    def spec_mean_accepted_len(self) -> float:
        return self.spec_accepted / self.spec_verify_steps if self.spec_verify_steps else 0.0
