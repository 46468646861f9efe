"""A calibration as stored: fitted coefficients with their evidence, in one JSON file.

The calibration file is read (`load`, `load_for`) and written (`Calibration.save`) here
and nowhere else.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.calibration.measurements import RunMeasurements
from analysis.curves.correction import LossCorrection, fit_loss_correction
from analysis.timemodel.hardware import HardwareInfo
from analysis.timemodel.model import Coefficients, ModelProfile
from common.errors import BadInputError
from common.files import write_atomic

FORMAT = "hpo-calibration"
VERSION = 1
MAX_STORED_RUNS = 50


@dataclass(frozen=True)
class LossRun:
    """One full run's final validation loss against its trial's uncorrected prediction."""

    run_id: str  # the full run's MLflow run id, or its result file: one record per run
    predicted: float  # the trial's p50 before any correction
    measured: float  # the full run's final validation loss

    def __post_init__(self) -> None:
        for name in ("predicted", "measured"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite loss > 0, but got {value=}")


@dataclass(frozen=True)
class Calibration:
    """Fitted coefficients for one hardware + model fingerprint, with their evidence."""

    version: int
    fingerprint: str
    hardware: HardwareInfo
    model: ModelProfile
    coefficients: Coefficients
    prior: Coefficients
    n_measurements: dict[str, int]
    created_at: str
    calibration_id: str
    runs: tuple[RunMeasurements, ...] = field(default=(), repr=False)
    # Accuracy evidence: full runs' measured final validation loss against what their trial
    # predicted before any correction. The correction the estimator applies is fitted from it.
    loss_runs: tuple[LossRun, ...] = field(default=(), repr=False)

    @property
    def loss_correction(self) -> LossCorrection:
        """Predicted -> measured final loss, fitted from `loss_runs` (identity with none)."""
        return fit_loss_correction([(r.predicted, r.measured) for r in self.loss_runs])

    def loss_correction_without(self, run_ids: Collection[str]) -> LossCorrection:
        """`loss_correction` fitted without the runs in `run_ids`: a study whose fit holds
        those runs' whole curves has taken what they measured there (counted twice, it moved
        the other configurations' predictions further off: benchmarks/rank_fidelity.py)."""
        kept = [(r.predicted, r.measured) for r in self.loss_runs if r.run_id not in run_ids]
        return fit_loss_correction(kept)

    def with_loss_runs(self, new: Sequence[LossRun]) -> Calibration:
        """This calibration with more full runs' losses; a run id already held is replaced."""
        ids = {r.run_id for r in new}
        kept = tuple(r for r in self.loss_runs if r.run_id not in ids)
        return dataclasses.replace(self, loss_runs=(*kept, *new)[-MAX_STORED_RUNS:])

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON document `save` writes."""
        return {
            "format": FORMAT,
            "version": self.version,
            "fingerprint": self.fingerprint,
            "calibration_id": self.calibration_id,
            "created_at": self.created_at,
            "hardware": dataclasses.asdict(self.hardware),
            "model": dataclasses.asdict(self.model),
            "coefficients": self.coefficients.to_dict(),
            "prior": self.prior.to_dict(),
            "n_measurements": dict(self.n_measurements),
            "runs": [run.to_dict() for run in self.runs],
            "loss": {
                "correction": self.loss_correction.to_dict(),
                "runs": [dataclasses.asdict(r) for r in self.loss_runs],
            },
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write as JSON atomically (a reader never sees half a file)."""
        write_atomic(Path(path), json.dumps(self.to_dict(), indent=1))


def load(path: str | os.PathLike[str]) -> Calibration:
    """Read a calibration file.

    Raises:
        BadInputError: Unreadable, malformed, or written by a newer version.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(f"cannot read calibration file {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BadInputError(f"{path} is not a calibration file (format != {FORMAT!r})")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BadInputError(f"{path}: calibration version must be an integer but got {version=}")
    if version > VERSION:
        raise BadInputError(
            f"{path}: calibration version {version} is newer than this hpo reads ({VERSION})"
        )
    try:
        return Calibration(
            version=version,
            fingerprint=str(data["fingerprint"]),
            hardware=HardwareInfo(**data["hardware"]),
            model=ModelProfile(**data["model"]),
            coefficients=Coefficients.from_dict(data["coefficients"]),
            prior=Coefficients.from_dict(data["prior"]),
            n_measurements={str(k): int(v) for k, v in data["n_measurements"].items()},
            created_at=str(data["created_at"]),
            calibration_id=str(data["calibration_id"]),
            runs=tuple(RunMeasurements.from_result_dict(r) for r in data["runs"]),
            loss_runs=tuple(LossRun(**r) for r in (data.get("loss") or {}).get("runs", [])),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BadInputError(f"{path}: malformed calibration file: {exc!r}") from exc


def load_for(
    path: str | os.PathLike[str], expected_fingerprint: str
) -> tuple[Calibration | None, str | None]:
    """Load the calibration at `path` if it matches `expected_fingerprint`.

    Returns:
        (calibration, None) on a match; (None, warning) when the file is for other hardware
        or another model, and the caller falls back to priors; (None, None) if no file.

    Raises:
        BadInputError: The file exists but is malformed or too new.
    """
    if not Path(path).exists():
        return None, None
    calibration = load(path)
    if calibration.fingerprint != expected_fingerprint:
        return None, (
            f"calibration {path} is for fingerprint {calibration.fingerprint} "
            f"({calibration.hardware.device_name}), not {expected_fingerprint}; using priors"
        )
    return calibration, None
