"""Full runs report back: their final loss and step times refit the study's predictions.

`python -m trainers.train --preset FILE` writes a report (its `--json` file, and the MLflow
artifact `result.json` of its run): what it measured, next to the preset's `estimate` and
`provenance`. Two things are learnt from it, for the hardware + model fingerprint the
estimate was made for:

- accuracy: the measured final validation loss against the trial's uncorrected predicted
  p50 (a `LossRun`), from which `Calibration.loss_correction` is fitted;
- time: the run's measured micro-steps, evaluations and checkpoints join the trials' and
  probes' in the time model's fit (a full run is the longest, most honest evidence).

A run that stopped before its end (window, signal) still measured its steps, but its last
loss is not the full run's final loss: it feeds the time fit only.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.calibration.file import Calibration, LossRun
from analysis.calibration.fit import update
from analysis.calibration.measurements import RunMeasurements
from common.errors import BadInputError
from common.fmt import format_duration
from common.redact import redact
from trainers.preset import changes_the_loss
from trainers.tracking import REPORT_ARTIFACT

log = logging.getLogger(__name__)

FULL_RUN_ROLE = "full_training"  # the `hpo.role` tag of a full run's MLflow run
# On the study, one attribute per finished full run of one of its trials, + its run id:
# {"trial", "loss", "added_at"} (`hpo.full_run_reports`; the report reads them).
MEASURED_PREFIX = "full_run_measured:"
# Their step times count for the time fit; their final loss is not the full schedule's end.
_STOPPED_EARLY = ("stopped_by_window", "stopped_by_signal", "stopped_early")


@dataclass(frozen=True)
class FullRun:
    """One full run's report, read and checked.

    Attributes:
        run_id: The MLflow run id, or the report file's path.
        report: The report (a `TrainResult` dict plus `estimate` and `provenance`).
    """

    run_id: str
    report: Mapping[str, Any]

    @property
    def fingerprint(self) -> str | None:
        """The hardware + model fingerprint the preset's estimate was made for."""
        value = (self.report.get("estimate") or {}).get("hardware_fingerprint")
        return str(value) if value else None

    @property
    def departed(self) -> bool:
        """Whether the run changed what its loss depends on over its preset (a smoke test at
        --max-steps 20, another rate or data): not the full run its estimate predicted."""
        return bool(changes_the_loss(self.report.get("preset_departures")))

    def loss_run(self) -> LossRun | None:
        """Measured against predicted final loss; None without both, if it stopped early, or
        if it was not the run predicted (`departed`)."""
        estimate = self.report.get("estimate") or {}
        predicted = estimate.get("final_val_loss_uncorrected_p50")
        measured = self.report.get("final_eval_loss")
        if self.report.get("status") != "finished" or predicted is None or measured is None:
            return None
        if self.departed:
            return None
        try:  # a report someone edited by hand: skip it rather than stop the study
            return LossRun(run_id=self.run_id, predicted=float(predicted), measured=float(measured))
        except (TypeError, ValueError):
            return None

    def shape_curve(self) -> dict[str, Any] | None:
        """The finished run's whole validation curve on its schedule, for the study's joint
        fit: the keys of `hpo.final_loss.TrialCurve.to_attr` (steps, samples, losses and the
        schedule: scheduler, warm-up ratio, peak rate, the run's optimizer steps). None when
        it stopped early (its schedule's end is not where it stopped), has no curve, or was
        not the run its preset predicted (`departed`: other data, say)."""
        report, spec = self.report, self.report.get("spec") or {}
        total = int(report.get("final_step") or 0)
        if report.get("status") != "finished" or total < 1 or "scheduler" not in spec:
            return None
        if self.departed:
            return None
        points = {
            int(r["step"]): (int(r.get("samples_seen", 0)), float(r["loss"]))
            for r in report.get("eval_records") or []
            if 1 <= int(r.get("step", 0)) <= total and r.get("loss") is not None
        }
        if report.get("final_eval_loss") is not None:
            points.setdefault(total, (0, float(report["final_eval_loss"])))
        if not points:
            return None
        steps = sorted(points)
        return {
            "steps": steps, "samples": [points[s][0] for s in steps],
            "losses": [points[s][1] for s in steps], "scheduler": spec["scheduler"],
            "warmup_ratio": spec.get("warmup_ratio", 0.0),
            "learning_rate": spec.get("learning_rate"), "full_run_steps": total,
        }  # fmt: skip

    def measurements(self) -> RunMeasurements | None:
        """The run's step times, when it finished or was stopped after measuring steps."""
        if self.report.get("status") not in ("finished", *_STOPPED_EARLY):
            return None
        if not self.report.get("micro_step_seconds"):
            return None
        gpus = int((self.report.get("spec") or {}).get("gpus") or 1)
        if gpus > 1:
            # Its steps include the all-reduce and the wait for the slowest of its GPUs,
            # which the time model adds for N GPUs itself: fitted as one GPU's, they would
            # count twice. Its loss still counts (`loss_run`).
            log.info("full run %s trained on %d GPUs: not used for the time model", self.run_id, gpus)
            return None
        try:
            return RunMeasurements.from_result_dict(dict(self.report))
        except BadInputError as exc:
            log.warning("full run %s: %s; not used for the time model", self.run_id, exc)
            return None


def read_report(path: str | Path) -> FullRun:
    """A report file written by `python -m trainers.train --json FILE`.

    Raises:
        BadInputError: Unreadable, not JSON, or not a training report.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(f"cannot read full-run report {path}: {exc}") from exc
    if not isinstance(data, dict) or "status" not in data or "final_eval_loss" not in data:
        raise BadInputError(
            f"{path} is not a full-run report (the --json file of python -m trainers.train)"
        )
    return FullRun(run_id=str(Path(path).resolve()), report=data)


def from_mlflow(client: Any, experiment_id: str, *, known: Sequence[str] = ()) -> list[FullRun]:
    """Finished or stopped full runs of an MLflow experiment that carry a report.

    Args:
        client: An `MlflowClient`.
        experiment_id: The study's experiment.
        known: Run ids already absorbed: their reports are not downloaded again.
    """
    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.`hpo.role` = '{FULL_RUN_ROLE}'", max_results=500
    )
    found = []
    for run in runs:
        run_id = run.info.run_id
        if run_id in known or run.info.status not in ("FINISHED", "KILLED"):
            continue
        with tempfile.TemporaryDirectory(prefix="hpo-full-run-") as folder:
            try:
                path = client.download_artifacts(run_id, REPORT_ARTIFACT, folder)
                report = json.loads(Path(path).read_text(encoding="utf-8"))
            except Exception as exc:  # a run from before reports existed, or a lost artifact
                log.debug("full run %s has no readable report: %s", run_id, redact(str(exc)))
                continue
        if isinstance(report, dict):
            found.append(FullRun(run_id=run_id, report=report))
    return found


def absorb(calibration: Calibration, runs: Sequence[FullRun]) -> tuple[Calibration, int, int]:
    """Fold full runs made for `calibration`'s fingerprint into it.

    Returns:
        The calibration, and how many runs it gained for accuracy and for time.
    """
    mine = [r for r in runs if r.fingerprint == calibration.fingerprint]
    held = {r.run_id for r in calibration.loss_runs}
    losses = [lr for r in mine if (lr := r.loss_run()) is not None]
    timed = 0
    for run in mine:
        measured = run.measurements()
        if measured is None or run.run_id in held or measured.capped() in calibration.runs:
            continue
        calibration = update(calibration, measured)
        timed += 1
    new_losses = [lr for lr in losses if lr not in calibration.loss_runs]
    return calibration.with_loss_runs(new_losses), len(new_losses), timed


# ----------------------------------------------------------------------------- TRL runs

TRL_PREFIX = "trl_run_measured:"  # on the study, one attribute per TRL run read, + its run id


@dataclass(frozen=True)
class TrlRun:
    """A `trl sft` run of one of the study's exported presets (`hpo.export --format trl`)
    that finished: its `train_runtime` against the estimate of that part of the run.

    Attributes:
        run_id: Its MLflow run id.
        trial: The trial its config was exported from.
        seconds: Its `train_runtime`.
        predicted: The export's estimate of it, {"p10", "p50", "p90"} seconds.
    """

    run_id: str
    trial: int
    seconds: float
    predicted: Mapping[str, float]

    @property
    def inside(self) -> bool:
        return self.predicted["p10"] <= self.seconds <= self.predicted["p90"]

    def line(self) -> str:
        """One line a user reads: "trial 16: 3.9 h measured by trl sft (train_runtime) against
        4.1 h predicted (p10-p90 3.5 h to 4.8 h), inside the band, x0.95 (MLflow run ...)"."""
        p = {q: format_duration(v) for q, v in self.predicted.items()}
        where = "inside the band" if self.inside else (
            "above p90" if self.seconds > self.predicted["p90"] else "below p10"
        )  # fmt: skip
        return (
            f"trial {self.trial}: {format_duration(self.seconds)} measured by trl sft "
            f"(train_runtime) against {p['p50']} predicted (p10-p90 {p['p10']} to {p['p90']}), "
            f"{where}, x{self.seconds / self.predicted['p50']:.2f} (MLflow run {self.run_id})"
        )

    def to_attr(self) -> dict[str, Any]:
        return {"trial": self.trial, "seconds": self.seconds, "predicted": dict(self.predicted)}

    @classmethod
    def from_attr(cls, run_id: str, value: object) -> TrlRun | None:
        if not isinstance(value, Mapping):
            return None
        try:
            predicted = {q: float(value["predicted"][q]) for q in ("p10", "p50", "p90")}
            run = cls(run_id, int(value["trial"]), float(value["seconds"]), predicted)
        except (KeyError, TypeError, ValueError):
            return None
        return run if math.isfinite(run.seconds) and run.predicted["p50"] > 0 else None


def trl_runs(study_attrs: Mapping[str, Any]) -> list[TrlRun]:
    """The study's recorded TRL runs, by trial."""
    runs = (
        TrlRun.from_attr(key.removeprefix(TRL_PREFIX), value)
        for key, value in study_attrs.items()
        if key.startswith(TRL_PREFIX)
    )
    return sorted((r for r in runs if r is not None), key=lambda r: (r.trial, r.run_id))
