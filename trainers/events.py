"""Plain callbacks of a training run.

`trainers` knows nothing of Optuna or MLflow: the study attaches its pruning and tracking
through these small objects. Any hook may return True to ask the run to stop cleanly
(the run then returns its result with `stop_reason` set; a run that saves checkpoints saves
one first, so it can be resumed).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.fmt import format_duration

if TYPE_CHECKING:
    from trainers.result import TrainResult


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
    grad_norm: float | None = None  # of the adapter's gradients, before clipping

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class EvalInfo:
    """One finished evaluation on the validation subset."""

    step: int
    loss: float
    seconds: float
    train_loss: float | None = None  # mean training loss since the previous evaluation

    @property
    def train_val_gap(self) -> float | None:
        """Validation minus training loss: growing while training falls means overfitting."""
        return None if self.train_loss is None else self.loss - self.train_loss


@dataclass(frozen=True)
class Forecast:
    """Where the run stands after `step`, and where it will end."""

    step: int
    total_steps: int
    elapsed_seconds: float
    remaining_seconds: float
    step_seconds: float  # median of the recent optimizer steps
    window_seconds: float | None
    margin_seconds: float
    stop_step: int  # where the run will end: `total_steps` when on track
    should_stop: bool  # save now and stop: one more step would cross the deadline
    eta_unix: float  # wall-clock time of the predicted end

    @property
    def progress(self) -> float:
        return self.step / self.total_steps if self.total_steps else 1.0

    @property
    def projected_seconds(self) -> float:
        return self.elapsed_seconds + self.remaining_seconds

    @property
    def deadline_seconds(self) -> float | None:
        if self.window_seconds is None:
            return None
        return self.window_seconds - self.margin_seconds

    @property
    def on_track(self) -> bool:
        deadline = self.deadline_seconds
        return deadline is None or self.projected_seconds <= deadline

    @property
    def behind_seconds(self) -> float:
        deadline = self.deadline_seconds
        return 0.0 if deadline is None else max(0.0, self.projected_seconds - deadline)

    @property
    def recommendation(self) -> str | None:
        """What to change when the run will not finish inside the window."""
        if self.on_track:
            return None
        hours = math.ceil((self.projected_seconds + self.margin_seconds) / 360) / 10
        return (
            f"behind schedule by {format_duration(self.behind_seconds)}: the run will stop at "
            f"step {self.stop_step:,} of {self.total_steps:,}; consider a larger micro-batch or "
            f"fewer epochs (--max-steps {self.stop_step} fits), or --window-hours {hours:g}; "
            "a stopped run continues with --resume"
        )

    def line(self) -> str:
        eta = time.strftime("%H:%M", time.localtime(self.eta_unix))
        text = (
            f"step {self.step:,}/{self.total_steps:,} ({100 * self.progress:.1f}%), "
            f"elapsed {format_duration(self.elapsed_seconds)}, "
            f"remaining ~{format_duration(self.remaining_seconds)}, ETA {eta}"
        )
        if self.window_seconds is not None:
            state = "on track" if self.on_track else "BEHIND"
            text += (
                f"; {state} for the {format_duration(self.window_seconds)} window "
                f"(margin {format_duration(self.margin_seconds)})"
            )
        return text


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
