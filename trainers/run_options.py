"""What a full run is given beside its `TrainSpec`: the window it must end in, and its MLflow.

`python -m trainers.train` takes them as flags; a study's `budget` and `tracking` parts
(`hpo.config`) extend them, so each is declared once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.checks import check_bounds, require
from common.config import knob


@dataclass(frozen=True)
class RunWindow:
    """The wall-clock window a full run must end in, and the margin kept free before its end."""

    where: ClassVar[str] = ""  # put before field names in messages (a study: "budget.")

    window_hours: float = knob(
        12.0,
        "The full run's wall-clock window, in hours.",
        above=0,
        ask="Window for the full run, in hours",
    )
    safety_margin_minutes: float = knob(
        30.0,
        "Kept free at the end of the window: the run stops and saves before it.",
        at_least=0,
        ask="Safety margin before the window ends, in minutes",
    )

    def __post_init__(self) -> None:
        check_bounds(self, self.where)
        require(
            self.safety_margin_minutes * 60 < self.window_hours * 3600,
            f"the safety margin (safety_margin_minutes={self.safety_margin_minutes:g} min) must "
            f"be shorter than the window ({self.window_hours:g} h)",
        )


@dataclass(frozen=True)
class RunTracking:
    """Where a run's MLflow records go."""

    uri: str | None = knob(
        None,
        "MLflow tracking URI, e.g. sqlite:///hpo-runs/mlflow.db. Default: a study's is the "
        "one in mlflow.yaml; a full run without one (or with 'off') is not tracked.",
        key="tracking_uri",
    )
    experiment_name: str | None = knob(
        None,
        "MLflow experiment. Default: a study's is the one in mlflow.yaml; a full run's, hpo-lora.",
        key="experiment_name",
    )
    system_metrics_seconds: float = knob(
        10.0,
        "Seconds between samples of CPU, memory and GPU use on each MLflow run (MLflow system "
        "metrics; 0: none).",
        key="system_metrics_seconds",
        at_least=0,
    )

    def __post_init__(self) -> None:
        check_bounds(self)
