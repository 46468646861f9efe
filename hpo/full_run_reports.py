"""What the study's own full runs measured: a configuration whose full run reported back is
judged by the final loss it measured, not by a prediction. Its presets trained by `trl sft`
(`hpo.export --format trl`) report their duration against the estimate (`trl_run_results`).

`python -m trainers.train --preset FILE --tracking-uri URI` tags its MLflow run with the
study and the trial the preset was exported from, and logs its final validation loss
(`val_loss_final`). The study's next session reads those (`full_run_results`) and keeps one
attribute per run on the study (`record`), so that the pick (`hpo.pick.pick_trial`), the
summary and the preset can say what the configuration measured.

A full run that early stopping ended (on by default: patience 5) measured the configuration
too: its best evaluation (`val_loss_best`), the checkpoint it keeps and the adapter its user
has. It counts with that loss and says so (`MeasuredRun.best_step`). It stays out of the loss
correction and the shape fit (`analysis.calibration.full_runs`): those compare with the
schedule's end, which it did not reach. A run the window or a signal stopped measured no
configuration's loss: it is left out.

A prediction is not thrown away: the pick compares the best measured loss with the best
configuration that has no full run yet, through that configuration's predicted level (its
end refit). On 11 recorded rank_fidelity sets (37 cases), a user who trained each pick's
full run until the pick was one already trained ended with the best of 8 configurations in
30 cases, against 15 for the study's first pick, after 1.5 full runs on average
(docs/rank-fidelity-history.md, "Once full runs report back").
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from analysis.calibration.full_runs import FULL_RUN_ROLE, MEASURED_PREFIX, TRL_PREFIX, TrlRun
from trainers.preset import DEPARTS_TAG

log = logging.getLogger(__name__)

# How trainers.train tags and logs a full run (trainers.train._PROVENANCE_TAGS,
# trainers.tracking.MlflowCallback.on_train_end).
ROLE_TAG, STUDY_TAG, TRIAL_TAG, STATUS_TAG = (
    "hpo.role", "hpo.study_name", "hpo.trial_number", "status",
)  # fmt: skip
FINAL_LOSS_METRIC = "val_loss_final"
# A run that stopped early: its best evaluation and its step (trainers.tracking.MlflowRun).
BEST_LOSS_METRIC, BEST_STEP_METRIC = "val_loss_best", "best_step"
DATA_PARAM = "data"  # the run's TrainSpec.data, logged with its other settings


@dataclass(frozen=True)
class MeasuredRun:
    """A full run of one of the study's trials that finished, or that early stopping ended.

    Attributes:
        run_id: Its MLflow run id.
        trial: The trial its preset was exported from.
        loss: Its final validation loss; its best one where it stopped early.
        added_at: When the study first read it (unix seconds).
        best_step: Where it stopped early: the step of its best evaluation (its kept
            checkpoint); None for a run that finished its schedule.
    """

    run_id: str
    trial: int
    loss: float
    added_at: float = 0.0
    best_step: int | None = None

    def to_attr(self) -> dict[str, Any]:
        attr: dict[str, Any] = {"trial": self.trial, "loss": self.loss, "added_at": self.added_at}
        if self.best_step is not None:
            attr["best_step"] = self.best_step
        return attr

    def ended(self) -> str:
        """How its loss was measured, for a line a user reads: "ended at 1.9000", or
        "stopped early; its best, at step 120, was 1.9000"."""
        if self.best_step is None:
            return f"ended at {self.loss:.4f}"
        return f"stopped early; its best, at step {self.best_step:,}, was {self.loss:.4f}"

    @classmethod
    def from_attr(cls, run_id: str, value: object) -> MeasuredRun | None:
        """None for a value this version cannot read (edited by hand, another version)."""
        if not isinstance(value, Mapping):
            return None
        best_step = value.get("best_step")  # absent: a run that finished its schedule
        try:
            run = cls(
                run_id, int(value["trial"]), float(value["loss"]), float(value["added_at"]),
                None if best_step is None else int(best_step),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError):
            return None
        return run if math.isfinite(run.loss) else None


def full_run_results(
    client: Any, experiment_id: str, study_name: str, data_path: str | None = None
) -> list[MeasuredRun]:
    """The full runs of `study_name` in an MLflow experiment that finished (with their final
    loss) or that early stopping ended (with their best loss and its step).

    Read from the runs' tags, params and metrics (no artifact downloaded): a run whose report
    another study of the experiment absorbed first still counts for its own study.

    Args:
        client: An `MlflowClient`.
        experiment_id: The study's experiment.
        study_name: The study whose runs to keep.
        data_path: The study's data; a run trained on other data (`--data` given over the
            preset's) is left out: its validation loss is not on the study's scale. So is a
            run tagged as changing what its loss depends on over its preset
            (`trainers.preset.DEPARTS_TAG`: --max-steps, another rate, other data).
    """
    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.`{ROLE_TAG}` = '{FULL_RUN_ROLE}'", max_results=500
    )
    found = []
    for run in runs:
        tags, metrics = run.data.tags, run.data.metrics
        status = tags.get(STATUS_TAG)
        if tags.get(STUDY_TAG) != study_name or status not in ("finished", "stopped_early"):
            continue  # another study's, stopped by the window or a signal, or failed
        if tags.get(DEPARTS_TAG):  # a smoke test at --max-steps 20, another rate...
            log.info("full run %s changed %s over its preset: not compared",
                     run.info.run_id, tags[DEPARTS_TAG])  # fmt: skip
            continue
        data = run.data.params.get(DATA_PARAM)
        if not same_data(data, data_path):
            log.info("full run %s trained on other data (%s): not compared", run.info.run_id, data)
            continue
        early = status == "stopped_early"
        try:
            trial = int(tags[TRIAL_TAG])
            loss = float(metrics[BEST_LOSS_METRIC if early else FINAL_LOSS_METRIC])
            best_step = int(metrics[BEST_STEP_METRIC]) if early else None
        except (KeyError, TypeError, ValueError):  # trained without a preset, or no loss
            continue
        if math.isfinite(loss):
            found.append(MeasuredRun(run.info.run_id, trial, loss, best_step=best_step))
    return found


def same_data(run_data: object, study_data: object) -> bool:
    """Whether a full run's data path names the study's data file; True where either is
    unknown (a run from before the path was logged: nothing to hold against it)."""
    if not run_data or not study_data:
        return True
    one, other = str(run_data), str(study_data)
    return one == other or Path(one).expanduser().resolve() == Path(other).expanduser().resolve()


def record(study: optuna.Study, runs: Iterable[MeasuredRun]) -> int:
    """Keep the runs the study does not hold yet, one attribute each (workers recording at
    once keep them all). Returns how many were new."""
    held = study.user_attrs
    now = time.time()
    new = 0
    for run in runs:
        key = MEASURED_PREFIX + run.run_id
        if key not in held:
            study.set_user_attr(key, dataclasses.replace(run, added_at=now).to_attr())
            new += 1
    return new


def measured_by_trial(study_attrs: Mapping[str, Any]) -> dict[int, MeasuredRun]:
    """The study's recorded full runs by the trial their preset came from: the most recent
    one where a trial's preset was trained more than once."""
    by_trial: dict[int, MeasuredRun] = {}
    for key, value in study_attrs.items():
        if not key.startswith(MEASURED_PREFIX):
            continue
        run = MeasuredRun.from_attr(key.removeprefix(MEASURED_PREFIX), value)
        held = by_trial.get(run.trial) if run else None
        if run is not None and (held is None or run.added_at >= held.added_at):
            by_trial[run.trial] = run
    return by_trial


# ----------------------------------------------------------------------------- TRL runs

RUNTIME_METRIC = "train_runtime"  # transformers' `Trainer.train` time, the model's load aside


def trl_run_results(client: Any, experiment_id: str, study_name: str) -> list[TrlRun]:
    """The finished `trl sft` runs of `study_name`'s exported presets in an MLflow experiment,
    each with the estimate its export tagged it with. A run whose arguments differ from those
    exported (another `--max_steps`, batch or length given on the command line) is left out:
    it is not the run the estimate was made for.
    """
    from hpo.export_formats import EXPORTED_ARGS_TAG, TRAIN_SECONDS_TAG, TRL_ROLE

    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.`{ROLE_TAG}` = '{TRL_ROLE}'", max_results=500
    )
    found = []
    for run in runs:
        tags, params = run.data.tags, run.data.params
        seconds = run.data.metrics.get(RUNTIME_METRIC)
        if tags.get(STUDY_TAG) != study_name or run.info.status != "FINISHED" or seconds is None:
            continue
        try:
            trial = int(tags[TRIAL_TAG])
            predicted = {q: float(v) for q, v in json.loads(tags[TRAIN_SECONDS_TAG]).items()}
            exported = json.loads(tags.get(EXPORTED_ARGS_TAG) or "{}")
        except (KeyError, TypeError, ValueError):  # exported before these tags, or edited
            continue
        changed = [k for k, v in exported.items() if k in params and not _same(v, params[k])]
        if changed:
            log.info("TRL run %s changed %s over its export: not compared", run.info.run_id,
                     ", ".join(changed))  # fmt: skip
            continue
        if {"p10", "p50", "p90"} <= set(predicted) and math.isfinite(float(seconds)):
            found.append(TrlRun(run.info.run_id, trial, float(seconds), predicted))
    return found


def _same(exported: object, logged: str) -> bool:
    """An exported argument against the param MLflow logged (a string: "8", "8.0", "True")."""
    try:
        return float(exported) == float(logged)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(exported).lower() == str(logged).lower()


def record_trl(study: optuna.Study, runs: Iterable[TrlRun]) -> int:
    """Keep the TRL runs the study does not hold yet, one attribute each. Returns how many
    were new."""
    held, new = study.user_attrs, 0
    for run in runs:
        if TRL_PREFIX + run.run_id not in held:
            study.set_user_attr(TRL_PREFIX + run.run_id, run.to_attr())
            new += 1
    return new
