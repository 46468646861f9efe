"""Plain callbacks of a training run.

`trainers` knows nothing of Optuna or MLflow: the study attaches its pruning and tracking
through these small objects. Any hook may return True to ask the run to stop cleanly
(the run then returns its result with `stop_reason` set; a run that saves checkpoints saves
one first, so it can be resumed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainers.result import TrainResult
    from trainers.window import Forecast


@dataclass(frozen=True)
class RunInfo:
    """Sent once, when the loop is about to start."""

    total_steps: int
    trainable_parameters: int
    total_parameters: int
    device: str
    precision: str
    start_step: int = 0  # the step a resumed run continues from
    eval_interval: int = 0
    checkpoint_interval: int = 0
    checkpoint_minutes: float = 0.0


@dataclass(frozen=True)
class StepInfo:
    """One finished optimizer step."""

    step: int
    total_steps: int
    loss: float
    learning_rate: float
    seconds: float  # wall time of the whole optimizer step (all micro-steps + update)
    tokens: int  # padded tokens processed by this optimizer step
    elapsed_seconds: float  # since the start of the run

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class EvalInfo:
    """One finished evaluation on the validation subset."""

    step: int
    loss: float
    seconds: float


class TrainingCallback:
    """Base class with no-op hooks; override what you need.

    A hook that returns True stops the run; the result then carries `stop_status` and
    `stop_reason(hook)`.
    """

    stop_status = "stopped"

    def stop_reason(self, hook: str) -> str:
        """Why this callback stopped the run (the result's `stop_reason`)."""
        return f"{type(self).__name__}.{hook}"

    def on_train_begin(self, info: RunInfo) -> bool | None:
        return None

    def on_step(self, info: StepInfo) -> bool | None:
        return None

    def on_eval(self, info: EvalInfo) -> bool | None:
        return None

    def on_checkpoint(self, step: int, path: str, seconds: float) -> bool | None:
        return None

    def on_forecast(self, forecast: Forecast) -> None:
        """Every few steps: elapsed, predicted remaining time and the window check."""
        return None

    def on_train_end(self, result: TrainResult) -> None:
        return None
