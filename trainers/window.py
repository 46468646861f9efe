"""The time window of a training run: forecasts from measured times and the stop decision.

The window (say 12 h) minus a safety margin (say 30 min) is the deadline. After every
optimizer step the guard predicts the remaining time from what this run measured: the median
of its recent step times, plus the evaluations and checkpoint saves still to come at their
measured cost. A run that will not make the deadline keeps going while it still can: it stops
(with a checkpoint) at the last step after which one more step, its evaluation and a save
would cross the deadline.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from trainers.callbacks import EvalInfo, RunInfo, StepInfo, TrainingCallback

UNMEASURED_SAVE_SECONDS = 0.5


def format_duration(seconds: float) -> str:
    """`3h 05m`, `40m`, `12s`: short enough for a progress bar."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes = int(round(seconds / 60))
    if minutes < 60:
        return f"{minutes}m"
    return f"{minutes // 60}h {minutes % 60:02d}m"


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

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(progress=self.progress, on_track=self.on_track, behind_s=self.behind_seconds)
        return out


class WindowGuard(TrainingCallback):
    """Measures the run and forecasts its end; the run stops when `should_stop` says so.

    Args:
        window_seconds: Length of the window; None forecasts without a deadline.
        margin_seconds: Safety margin before the window ends.
        report_every: Steps between reported forecasts (0: every 1 % of the run, at least
            every 10 steps apart).
        started_at: `clock()` value when the window opened (default: now).
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        *,
        window_seconds: float | None = None,
        margin_seconds: float = 0.0,
        report_every: int = 0,
        started_at: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_seconds = window_seconds
        self.margin_seconds = margin_seconds
        self.report_every = report_every
        self.clock = clock
        self.started_at = clock() if started_at is None else started_at
        self.steps: deque[float] = deque(maxlen=50)
        self.evals: deque[float] = deque(maxlen=10)
        self.saves: deque[float] = deque(maxlen=10)
        self.run = RunInfo(0, 0, 0, "", "")
        self.last: Forecast | None = None

    def on_train_begin(self, info: RunInfo) -> None:
        self.run = info

    def on_step(self, info: StepInfo) -> None:
        self.steps.append(info.seconds)

    def on_eval(self, info: EvalInfo) -> None:
        self.evals.append(info.seconds)

    def on_checkpoint(self, step: int, path: str, seconds: float) -> None:
        self.saves.append(seconds)

    def forecast(self, step: int) -> Forecast:
        """The forecast after `step` (call after `on_step`)."""
        run, total = self.run, self.run.total_steps
        recent = list(self.steps)
        # The first steps pay for warm-up; drop them once there are enough others.
        step_s = statistics.median(recent[2:] if len(recent) > 4 else recent) if recent else 0.0
        eval_s = statistics.median(self.evals) if self.evals else step_s
        save_s = statistics.median(self.saves) if self.saves else 2 * step_s
        left = max(0, total - step)
        checkpointing = run.checkpoint_interval > 0 or run.checkpoint_minutes > 0
        n_evals = _multiples(step - 1, total, run.eval_interval)
        if run.eval_interval == 0 or total % run.eval_interval:
            n_evals += 1  # the run always evaluates at its end
        n_saves = _multiples(step - 1, total, run.checkpoint_interval)
        if run.checkpoint_minutes > 0:
            n_saves += int(left * step_s / (60 * run.checkpoint_minutes))
        if checkpointing and (run.checkpoint_interval == 0 or total % run.checkpoint_interval):
            n_saves += 1  # the final save
        remaining = left * step_s + n_evals * eval_s + n_saves * save_s
        elapsed = self.clock() - self.started_at

        stop_step, should_stop = total, False
        if self.window_seconds is not None and left:
            deadline = self.window_seconds - self.margin_seconds
            due_now = eval_s * _due(step, run.eval_interval) + save_s * _due(
                step, run.checkpoint_interval
            )
            # Continuing means: what is due now, one more step, its evaluation, then a save.
            # That decision must survive a slow step and a first save whose cost is not
            # measured yet, so it takes the slowest recent step and at least 0.5 s to save.
            slow_step = max(recent[-10:]) if recent else 0.0
            stop_save = save_s if self.saves else max(save_s, UNMEASURED_SAVE_SECONDS)
            continuing = (
                due_now + slow_step + eval_s * _due(step + 1, run.eval_interval) + stop_save
            )
            should_stop = elapsed + continuing > deadline
            if elapsed + remaining > deadline:
                per_step = step_s
                if run.eval_interval:
                    per_step += eval_s / run.eval_interval
                if run.checkpoint_interval:
                    per_step += save_s / run.checkpoint_interval
                room = deadline - elapsed - save_s
                fits = int(room // per_step) if per_step > 0 and room > 0 else 0
                stop_step = min(total, step + fits)
            if should_stop:
                stop_step = step
        forecast = Forecast(
            step=step,
            total_steps=total,
            elapsed_seconds=elapsed,
            remaining_seconds=remaining,
            step_seconds=step_s,
            window_seconds=self.window_seconds,
            margin_seconds=self.margin_seconds,
            stop_step=stop_step,
            should_stop=should_stop,
            eta_unix=time.time() + remaining,
        )
        return forecast

    def should_report(self, forecast: Forecast) -> bool:
        """Whether to show `forecast` (and remember it as the last one seen).

        Every `report_every` steps, the first time, and whenever the on-track verdict changes.
        """
        every = self.report_every or max(10, forecast.total_steps // 100)
        flipped = self.last is not None and self.last.on_track != forecast.on_track
        first = self.last is None
        self.last = forecast
        return first or flipped or forecast.should_stop or forecast.step % every == 0


def _multiples(after: int, upto: int, interval: int) -> int:
    """How many multiples of `interval` lie in (after, upto]."""
    if interval <= 0 or upto <= after:
        return 0
    return upto // interval - max(after, 0) // interval


def _due(step: int, interval: int) -> int:
    return int(interval > 0 and step % interval == 0)
