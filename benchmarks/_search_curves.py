"""The arithmetic of `hpo_efficiency.py`: picks over search time, shares, spreads.

Pure functions over trial records (no training, no Optuna), so they are tested on their own
(`tests/test_hpo_efficiency.py`).

A method's *pick* at search time t is what it would hand over had it stopped at t: the best
of its trials finished by t by its own score, among those it considers fitting (only
`hpo.study` judges that; a peer considers every trial). Each distinct pick gets its full run
with the window enforced; the pick's full-run loss over search time is the best-so-far curve.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TrialRecord:
    """One trial of a search, as the benchmark sees it.

    Attributes:
        number: The trial's number in its study.
        started: Seconds since the method's search began.
        finished: Seconds since the method's search began (the trial's end).
        score: The method's own score of the trial (lower is better); None: no score
            (pruned, failed, never trained).
        fits: The method itself considers the trial's full run to fit its window.
        infeasible: The benchmark's time model predicts the trial's full run (p50) beyond the
            window.
        trained: The trial trained (False: the method refused it before any step, e.g.
            hpo's check judged its full run beyond the window; its seconds are bookkeeping:
            sampling, the check, the storage writes).
    """

    number: int
    started: float
    finished: float
    score: float | None
    fits: bool = True
    infeasible: bool = False
    trained: bool = True

    @property
    def seconds(self) -> float:
        return max(0.0, self.finished - self.started)


def picks_over_time(trials: Sequence[TrialRecord]) -> list[tuple[float, int]]:
    """(search time, trial number) each time the method's pick changes.

    The pick is the lowest score among scored trials finished so far, preferring those the
    method considers fitting (as `hpo.pick.best_complete_trial`: a fitting trial while one
    exists), ties to the lower trial number.
    """
    changes: list[tuple[float, int]] = []
    done: list[TrialRecord] = []
    for trial in sorted(trials, key=lambda t: (t.finished, t.number)):
        if trial.score is None or not math.isfinite(trial.score):
            continue
        done.append(trial)
        fitting = [t for t in done if t.fits]
        pick = min(fitting or done, key=lambda t: (t.score, t.number))
        if not changes or changes[-1][1] != pick.number:
            changes.append((trial.finished, pick.number))
    return changes


def pick_loss_curve(
    changes: Sequence[tuple[float, int]], full_run_loss: Mapping[int, float]
) -> list[tuple[float, float]]:
    """The pick's full-run loss over search time: (time the pick changed, its full-run loss)."""
    return [(time, full_run_loss[number]) for time, number in changes]


def time_to_reach(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """The first search time at which the pick's full-run loss is <= target (None: never)."""
    for time, loss in curve:
        if loss <= target:
            return time
    return None


def time_ratio(reached: float | None, peer_search_seconds: float) -> float | None:
    """Time to reach the peer's final quality over the peer's whole search time."""
    if reached is None or peer_search_seconds <= 0:
        return None
    return reached / peer_search_seconds


def infeasible_share(trials: Sequence[TrialRecord], *, trained_only: bool = False) -> float:
    """The share of the trials' seconds spent on configurations whose full run cannot fit.

    `trained_only`: count only trials that trained (the compute a GPU would spend on them),
    not the seconds of refusing a configuration before training.
    """
    total = sum(t.seconds for t in trials)
    if total <= 0:
        return 0.0
    spent = sum(t.seconds for t in trials if t.infeasible and (t.trained or not trained_only))
    return spent / total


def share_beyond(durations: Sequence[float], available_seconds: float) -> float:
    """The share of configurations whose predicted full run is longer than the window."""
    if not durations:
        raise ValueError(f"share_beyond needs durations, but got {durations=}")
    return sum(d > available_seconds for d in durations) / len(durations)


def window_for_share(durations: Sequence[float], share: float) -> float:
    """The window (seconds) that leaves about `share` of the configurations beyond it.

    The quantile at 1 - share of the predicted durations: with share 0.5, the median.
    """
    if not durations or not 0 < share < 1:
        raise ValueError(f"window_for_share needs durations and 0 < share < 1, but got {share=}")
    ordered = sorted(durations)
    index = min(len(ordered) - 1, max(0, math.ceil((1 - share) * len(ordered)) - 1))
    return ordered[index]


def mean_and_spread(values: Sequence[float]) -> dict[str, float | None]:
    """Mean, sample standard deviation, min and max (None where there are too few values)."""
    if not values:
        return {"mean": None, "sd": None, "min": None, "max": None, "n": 0}
    return {
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else None,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def median_or_none(values: Sequence[float | None]) -> float | None:
    """The median over values, a None (never reached) counting as infinitely late.

    None when the median itself is one of those.
    """
    if not values:
        return None
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    n = len(ordered)
    middle = ordered[(n - 1) // 2 : n // 2 + 1]
    if any(v is None for v in middle):
        return None
    return statistics.fmean(v for v in middle if v is not None)
