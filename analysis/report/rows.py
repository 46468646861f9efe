"""A study's trials as flat rows of the numbers the report plots; full-run result files.

Pure data: no plotting here, so every rule (which trial counts as never trained, where a
trial's predicted loss comes from) is tested without matplotlib.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.study_keys import ESTIMATE_ATTR, NEVER_TRAINED_ATTR, STATE_REASON_ATTR
from common.errors import BadInputError

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

GIB = 1024**3
NEVER_TRAINED = "never_trained"
STATES = ("complete", "pruned", "failed", NEVER_TRAINED, "running")




@dataclass(frozen=True)
class TrialRow:
    """One trial, reduced to what the report reads.

    Attributes:
        number: The trial's number in the study.
        state: complete, pruned (trained, stopped early), failed, never_trained (over the
            budget before training) or running.
        value: The objective value (complete trials only).
        last_intermediate: The last value reported to the pruner, if any.
        started: When the trial started.
        finished: When it finished (None while running).
        params: The sampled parameters.
        attrs: The trial's user attributes.
    """

    number: int
    state: str
    value: float | None
    last_intermediate: float | None
    started: datetime | None
    finished: datetime | None
    params: Mapping[str, Any] = field(default_factory=dict)
    attrs: Mapping[str, Any] = field(default_factory=dict)
    end_band: Mapping[str, Any] | None = None

    def number_attr(self, name: str) -> float | None:
        """A user attribute as a finite float, else None."""
        return finite(self.attrs.get(name))

    def estimate(self, *path: str) -> float | None:
        """A number inside the `estimate` attribute, e.g. ``estimate("duration_hours", "p50")``."""
        node: Any = self.attrs.get(ESTIMATE_ATTR)
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        return finite(node)

    @property
    def predicted_loss(self) -> tuple[float, float, float] | None:
        """(p10, p50, p90) of the predicted final loss (corrected), when recorded."""
        band = self.attrs.get("predicted_final_loss")
        if not isinstance(band, Mapping):
            return None
        values = [finite(band.get(key)) for key in ("p10", "p50", "p90")]
        if any(v is None for v in values):
            return None
        p10, p50, p90 = (float(v) for v in values if v is not None)
        return p10, p50, p90

    @property
    def loss_for_front(self) -> float | None:
        """The predicted final loss's p50 as the study's end refitted it (`end_band`), else
        as the trial recorded it, else the trial's value."""
        end = finite((self.end_band or {}).get("p50"))
        if end is not None:
            return end
        band = self.predicted_loss
        return band[1] if band else self.value


def _band(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def finite(value: object) -> float | None:
    """`value` as a float when it is a finite number (bools excluded), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def classify(trial: FrozenTrial) -> str:
    """The report's state of a trial: Optuna's, with never-trained pruned trials apart."""
    from optuna.trial import TrialState

    reason = trial.user_attrs.get(STATE_REASON_ATTR)
    if trial.state == TrialState.PRUNED and (
        trial.user_attrs.get(NEVER_TRAINED_ATTR) in (True, "true")
        or (isinstance(reason, str) and reason.startswith("predicted"))
    ):
        return NEVER_TRAINED
    return {
        TrialState.COMPLETE: "complete",
        TrialState.PRUNED: "pruned",
        TrialState.FAIL: "failed",
    }.get(trial.state, "running")


def trial_rows(
    trials: Iterable[FrozenTrial], end_predictions: Mapping[str, Any] | None = None
) -> list[TrialRow]:
    """One row per trial, in trial-number order.

    `end_predictions`: the study's `END_PREDICTIONS_ATTR` ({trial number: band}, the final
    losses its end predicted again with every curve; `hpo.export.end_predictions`).
    """
    ends = end_predictions if isinstance(end_predictions, Mapping) else {}
    rows = []
    for trial in trials:
        state = classify(trial)
        steps = trial.intermediate_values
        rows.append(
            TrialRow(
                number=trial.number,
                state=state,
                # The first objective (the loss) when the study has several.
                value=finite(trial.values[0]) if state == "complete" and trial.values else None,
                last_intermediate=finite(steps[max(steps)]) if steps else None,
                started=trial.datetime_start,
                finished=trial.datetime_complete,
                params=dict(trial.params),
                attrs=dict(trial.user_attrs),
                end_band=_band(ends.get(str(trial.number))),
            )
        )
    return sorted(rows, key=lambda row: row.number)


def best_complete(rows: Sequence[TrialRow], *, minimize: bool = True) -> TrialRow | None:
    """The complete trial with the best value (the lowest trial number on ties), or None."""
    complete = [row for row in rows if row.state == "complete" and row.value is not None]
    if not complete:
        return None
    sign = 1.0 if minimize else -1.0
    return min(complete, key=lambda row: (sign * float(row.value or 0.0), row.number))


def count(rows: Sequence[TrialRow]) -> dict[str, int]:
    """Trials per report state, every state present (zero when none)."""
    counts = dict.fromkeys(STATES, 0)
    for row in rows:
        counts[row.state] += 1
    return counts


@dataclass(frozen=True)
class FullRun:
    """A full training run's measured duration and, when the preset gave one, its prediction.

    Attributes:
        name: The result file's name.
        seconds: Measured wall time (including the runs it resumed from, when recorded).
        predicted: (p10, p50, p90) predicted seconds; a missing quantile is None.
    """

    name: str
    seconds: float
    predicted: tuple[float | None, float | None, float | None]


def read_full_runs(paths: Iterable[str | Path]) -> list[FullRun]:
    """Read `python -m trainers.train --json` result files.

    Raises:
        BadInputError: A file is missing, not JSON, or has no positive `wall_seconds`.
    """
    runs = []
    for path in paths:
        file = Path(path)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BadInputError(f"--full-run: file not found: {path}") from None
        except (OSError, ValueError) as exc:
            raise BadInputError(f"--full-run {path}: not a JSON result: {exc}") from None
        wall = finite(data.get("wall_seconds")) if isinstance(data, dict) else None
        if wall is None or wall <= 0:
            raise BadInputError(f"--full-run {path}: needs a positive wall_seconds")
        # A resumed run's own wall time is a part: the total is what the prediction was for.
        seconds = finite(data.get("cumulative_wall_seconds")) or wall
        p50 = _predicted(data, "p50") or finite(data.get("predicted_seconds"))
        predicted = (_predicted(data, "p10"), p50, _predicted(data, "p90"))
        runs.append(FullRun(name=file.name, seconds=max(seconds, wall), predicted=predicted))
    return runs


def _predicted(report: dict[str, Any], quantile: str) -> float | None:
    """A predicted duration quantile in seconds: given as such, or from the preset's estimate.

    `python -m trainers.train --json` carries the preset's estimate, whose band is in hours.
    """
    seconds = finite(report.get(f"predicted_seconds_{quantile}"))
    if seconds is None:
        hours = finite(((report.get("estimate") or {}).get("duration_hours") or {}).get(quantile))
        seconds = None if hours is None else 3600 * hours
    return seconds
