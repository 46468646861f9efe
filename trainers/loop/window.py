"""The time window of a training run: forecasts from measured times and the stop decision.

The window (say 12 h) minus a safety margin (say 30 min) is the deadline. After every
optimizer step the guard predicts the remaining time from what this run measured: the median
of its recent step times, plus the evaluations and checkpoint saves still to come at their
measured cost. A run that will not make the deadline keeps going while it still can: it stops
(with a checkpoint) at the last step after which one more step, its evaluation and a save
would cross the deadline.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from trainers.events import EvalInfo, Forecast, RunInfo, StepInfo, TrainingCallback

UNMEASURED_SAVE_SECONDS = 0.5


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
        recent = list(self.steps)
        # The first steps pay for warm-up; drop them once there are enough others.
        step_s = statistics.median(recent[2:] if len(recent) > 4 else recent) if recent else 0.0
        eval_s = statistics.median(self.evals) if self.evals else step_s
        costs = _Costs(
            step=step_s,
            eval=eval_s,
            save=statistics.median(self.saves) if self.saves else 2 * step_s,
            slowest_step=max(recent[-10:]) if recent else 0.0,
            save_measured=bool(self.saves),
        )
        total = self.run.total_steps
        remaining = _remaining_seconds(self.run, step, costs)
        elapsed = self.clock() - self.started_at
        stop_step, should_stop = total, False
        if self.window_seconds is not None and step < total:
            deadline = self.window_seconds - self.margin_seconds
            stop_step, should_stop = _stop_point(
                self.run, step, elapsed, deadline, remaining, costs
            )
        return Forecast(
            step=step,
            total_steps=total,
            elapsed_seconds=elapsed,
            remaining_seconds=remaining,
            step_seconds=costs.step,
            window_seconds=self.window_seconds,
            margin_seconds=self.margin_seconds,
            stop_step=stop_step,
            should_stop=should_stop,
            eta_unix=time.time() + remaining,
        )

    def should_report(self, forecast: Forecast) -> bool:
        """Whether to show `forecast` (and remember it as the last one seen).

        Every `report_every` steps, the first time, and whenever the on-track verdict changes.
        """
        every = self.report_every or max(10, forecast.total_steps // 100)
        flipped = self.last is not None and self.last.on_track != forecast.on_track
        first = self.last is None
        self.last = forecast
        return first or flipped or forecast.should_stop or forecast.step % every == 0


@dataclass(frozen=True)
class _Costs:
    """What the run measured so far, in seconds (medians of the recent ones)."""

    step: float
    eval: float
    save: float
    slowest_step: float  # of the last 10 steps
    save_measured: bool  # False: `save` is a guess (twice a step)


def _remaining_seconds(run: RunInfo, step: int, costs: _Costs) -> float:
    """The steps, evaluations and saves still to come after `step`."""
    total = run.total_steps
    left = max(0, total - step)
    checkpointing = run.checkpoint_interval > 0 or run.checkpoint_minutes > 0
    n_evals = _multiples(step - 1, total, run.eval_interval)
    if run.eval_interval == 0 or total % run.eval_interval:
        n_evals += 1  # the run always evaluates at its end
    n_saves = _multiples(step - 1, total, run.checkpoint_interval)
    if run.checkpoint_minutes > 0:
        n_saves += int(left * costs.step / (60 * run.checkpoint_minutes))
    if checkpointing and (run.checkpoint_interval == 0 or total % run.checkpoint_interval):
        n_saves += 1  # the final save
    return left * costs.step + n_evals * costs.eval + n_saves * costs.save


def _stop_point(
    run: RunInfo, step: int, elapsed: float, deadline: float, remaining: float, costs: _Costs
) -> tuple[int, bool]:
    """Where a run with a deadline ends, and whether it must stop (and save) now."""
    due_now = costs.eval * _due(step, run.eval_interval) + costs.save * _due(
        step, run.checkpoint_interval
    )
    # Continuing means: what is due now, one more step, its evaluation, then a save.
    # That decision must survive a slow step and a first save whose cost is not
    # measured yet, so it takes the slowest recent step and at least 0.5 s to save.
    stop_save = costs.save if costs.save_measured else max(costs.save, UNMEASURED_SAVE_SECONDS)
    continuing = (
        due_now + costs.slowest_step + costs.eval * _due(step + 1, run.eval_interval) + stop_save
    )
    if elapsed + continuing > deadline:
        return step, True
    if elapsed + remaining <= deadline:
        return run.total_steps, False
    per_step = costs.step
    if run.eval_interval:
        per_step += costs.eval / run.eval_interval
    if run.checkpoint_interval:
        per_step += costs.save / run.checkpoint_interval
    room = deadline - elapsed - costs.save
    fits = int(room // per_step) if per_step > 0 and room > 0 else 0
    return min(run.total_steps, step + fits), False


def _multiples(after: int, upto: int, interval: int) -> int:
    """How many multiples of `interval` lie in (after, upto]."""
    if interval <= 0 or upto <= after:
        return 0
    return upto // interval - max(after, 0) // interval


def _due(step: int, interval: int) -> int:
    return int(interval > 0 and step % interval == 0)
