"""Recovery policy of a training run: out of memory, NaN/inf loss, divergence.

Out of memory: halve the micro-batch and double the accumulation, so the effective batch
(and with it the optimisation) stays the same, and continue from the last checkpoint.
NaN/inf or a runaway validation loss: roll back to the last checkpoint taken before the
trouble and lower the learning rate. Each decision is recorded with its reason; when the
options run out the run gives up with a message saying why.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from common.errors import GaveUp
from trainers.spec import RecoverySpec, TrainSpec


@dataclass
class RecoveryState:
    """Settings a run continues with after its recoveries; saved in every checkpoint."""

    micro_batch_size: int
    gradient_accumulation_steps: int
    lr_scale: float = 1.0
    rollbacks: int = 0
    recoveries: list[str] = field(default_factory=list)

    @classmethod
    def from_spec(cls, spec: TrainSpec) -> RecoveryState:
        return cls(spec.micro_batch_size, spec.gradient_accumulation_steps)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RecoveryState:
        return cls(
            micro_batch_size=int(values["micro_batch_size"]),
            gradient_accumulation_steps=int(values["gradient_accumulation_steps"]),
            lr_scale=float(values.get("lr_scale", 1.0)),
            rollbacks=int(values.get("rollbacks", 0)),
            recoveries=[str(r) for r in values.get("recoveries", [])],
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def after_out_of_memory(self, error: str, step: int) -> str:
        """Halve the micro-batch, double the accumulation; returns the logged reason.

        Raises:
            GaveUp: The micro-batch is already 1.
        """
        if self.micro_batch_size <= 1:
            raise GaveUp(
                f"out of memory after step {step} with micro-batch 1 ({error}); nothing left to "
                "shrink: use a shorter max_length, gradient checkpointing, a smaller LoRA "
                "rank or a larger device"
            )
        old = (self.micro_batch_size, self.gradient_accumulation_steps)
        self.micro_batch_size = max(1, self.micro_batch_size // 2)
        self.gradient_accumulation_steps *= 2
        reason = (
            f"out of memory after step {step} ({error}): micro-batch {old[0]} -> "
            f"{self.micro_batch_size}, accumulation {old[1]} -> {self.gradient_accumulation_steps}"
        )
        self.recoveries.append(reason)
        return reason

    def after_divergence(self, error: str, recovery: RecoverySpec) -> str:
        """Lower the learning rate for a rollback; returns the logged reason.

        Raises:
            GaveUp: `recovery.max_rollbacks` rollbacks were spent already.
        """
        if self.rollbacks >= recovery.max_rollbacks:
            raise GaveUp(
                f"{error}; gave up after {self.rollbacks} rollback(s) (max_rollbacks="
                f"{recovery.max_rollbacks}): try a lower learning rate or more warm-up"
            )
        self.rollbacks += 1
        self.lr_scale *= recovery.lr_factor
        reason = (
            f"{error}: rollback {self.rollbacks}/{recovery.max_rollbacks}, learning rate x"
            f"{recovery.lr_factor:g} (now x{self.lr_scale:g} of the configured one)"
        )
        self.recoveries.append(reason)
        return reason


class DivergenceMonitor:
    """Flags a validation loss that stays far above its running minimum.

    Diverging means: loss > `ratio` x the lowest loss seen so far, on `evals` consecutive
    evaluations (one bad evaluation is noise; several in a row are a trend).
    """

    def __init__(self, ratio: float, evals: int) -> None:
        self.ratio = ratio
        self.evals = evals
        self.history: list[tuple[int, float]] = []

    @property
    def best_step(self) -> int | None:
        """Step of the lowest validation loss seen (where a rollback should go back to)."""
        finite = [(loss, step) for step, loss in self.history if math.isfinite(loss)]
        return min(finite)[1] if finite else None

    def observe(self, step: int, loss: float) -> str | None:
        """Record one evaluation; returns why the run diverged, or None."""
        if not math.isfinite(loss):
            return f"validation loss became {loss} at step {step}"
        self.history.append((step, loss))
        if len(self.history) <= self.evals:
            return None
        best = min(value for _, value in self.history)
        recent = self.history[-self.evals :]
        if all(value > self.ratio * best for _, value in recent):
            return (
                f"validation loss diverged: {recent[-1][1]:.4f} at step {step} is above "
                f"{self.ratio:g} x its minimum {best:.4f} for {self.evals} evaluations"
            )
        return None

    def forget_after(self, step: int) -> None:
        """Drop evaluations newer than `step` (they belong to an abandoned branch)."""
        self.history = [(s, loss) for s, loss in self.history if s <= step]
