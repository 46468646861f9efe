"""MLflow tracking of a study: one parent run per study, one nested run per trial.

Per-step values are buffered and sent with `log_batch` (at most 1000 metrics a call), so a
trial costs a handful of round trips however long it trains. Every worker of a study finds
the same parent run through the study's user attribute `mlflow_parent_run_id`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import optuna

from trainers.callbacks import EvalInfo, StepInfo, TrainingCallback
from trainers.errors import BadInputError
from trainers.result import TrainResult

PARENT_ATTR = "mlflow_parent_run_id"
EXPERIMENT_ATTR = "mlflow_experiment_id"
MAX_METRICS_PER_CALL = 1000
MAX_PARAMS_PER_CALL = 100
MAX_TAGS_PER_CALL = 100
# MLflow run status for each trial state: the runs table shows it in its status column.
STATUS = {"complete": "FINISHED", "pruned": "KILLED", "failed": "FAILED"}


def _now_ms() -> int:
    return int(time.time() * 1000)


class TrialMetrics(TrainingCallback):
    """Buffers a trial's per-step metric histories and sends them in batches."""

    def __init__(self, tracker: Tracker, run_id: str, flush_seconds: float = 30.0) -> None:
        self.tracker = tracker
        self.run_id = run_id
        self.flush_seconds = flush_seconds
        self.buffer: list[Any] = []
        self.last_flush = time.monotonic()

    def _add(self, key: str, value: float, step: int) -> None:
        from mlflow.entities import Metric

        self.buffer.append(Metric(key, float(value), _now_ms(), step))

    def on_step(self, info: StepInfo) -> None:
        self._add("train_loss", info.loss, info.step)
        self._add("tokens_per_second", info.tokens_per_second, info.step)
        self._add("step_time_s", info.seconds, info.step)
        self._add("learning_rate", info.learning_rate, info.step)
        if (
            len(self.buffer) >= MAX_METRICS_PER_CALL
            or time.monotonic() - self.last_flush > self.flush_seconds
        ):
            self.flush()

    def on_eval(self, info: EvalInfo) -> None:
        self._add("val_loss", info.loss, info.step)

    def on_train_end(self, result: TrainResult) -> None:
        self.flush()

    def flush(self) -> None:
        self.tracker.log_batch(self.run_id, metrics=self.buffer)
        self.buffer = []
        self.last_flush = time.monotonic()


class Tracker:
    """The study's MLflow side. Built on `MlflowClient` (no global active-run state)."""

    def __init__(
        self, tracking_uri: str, experiment_name: str, *, artifact_dir: str | None = None
    ) -> None:
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        if tracking_uri.startswith("sqlite:///"):
            Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=tracking_uri)
        try:
            experiment = self.client.get_experiment_by_name(experiment_name)
        except Exception as exc:
            raise BadInputError(
                f"cannot reach MLflow tracking store {tracking_uri}: {exc}"
            ) from None
        if experiment is None:
            location = None
            if artifact_dir and not tracking_uri.startswith(("http://", "https://")):
                location = Path(artifact_dir).resolve().as_uri()
            self.experiment_id = self.client.create_experiment(
                experiment_name,
                artifact_location=location,
                # Tells the UI this is model development, so it opens on the runs table.
                tags={"mlflow.experimentKind": "finetuning"},
            )
        else:
            self.experiment_id = experiment.experiment_id

    # -- low level -------------------------------------------------------------------------
    def log_batch(
        self,
        run_id: str,
        *,
        metrics: Iterable[Any] = (),
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        """Send metrics, params and tags in as few calls as MLflow's limits allow."""
        from mlflow.entities import Param, RunTag

        metric_list = list(metrics)
        param_list = [Param(k, _param_value(v)) for k, v in (params or {}).items()]
        tag_list = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
        while metric_list or param_list or tag_list:
            self.client.log_batch(
                run_id,
                metrics=metric_list[:MAX_METRICS_PER_CALL],
                params=param_list[:MAX_PARAMS_PER_CALL],
                tags=tag_list[:MAX_TAGS_PER_CALL],
            )
            metric_list = metric_list[MAX_METRICS_PER_CALL:]
            param_list = param_list[MAX_PARAMS_PER_CALL:]
            tag_list = tag_list[MAX_TAGS_PER_CALL:]

    # -- the study's parent run --------------------------------------------------------------
    def ensure_parent(self, study: optuna.Study, params: Mapping[str, Any]) -> str:
        """The study's parent run: reused when the study already has one (resume, workers)."""
        run_id = study.user_attrs.get(PARENT_ATTR)
        if run_id and self._run_exists(run_id):
            self.client.update_run(run_id, status="RUNNING")
            return str(run_id)
        run = self.client.create_run(
            self.experiment_id,
            run_name=study.study_name,
            tags={"hpo.study_name": study.study_name, "hpo.role": "study"},
        )
        run_id = run.info.run_id
        study.set_user_attr(PARENT_ATTR, run_id)
        study.set_user_attr(EXPERIMENT_ATTR, self.experiment_id)
        self.log_batch(run_id, params=params)
        return str(run_id)

    def _run_exists(self, run_id: str) -> bool:
        try:
            self.client.get_run(run_id)
            return True
        except Exception:
            return False

    def update_parent(self, parent_run_id: str, study: optuna.Study) -> dict[str, int]:
        """Best value so far and counts per state, computed from the study itself."""
        from mlflow.entities import Metric

        counts = state_counts(study)
        finished = sum(counts.values())
        metrics = [Metric(f"n_{k}", float(v), _now_ms(), finished) for k, v in counts.items()]
        tags: dict[str, Any] = {}
        try:
            best = study.best_trial
        except ValueError:
            best = None
        if best is not None and best.value is not None:
            metrics.append(Metric("best_value", float(best.value), _now_ms(), finished))
            tags["best_trial"] = best.number
        self.log_batch(parent_run_id, metrics=metrics, tags=tags)
        return counts

    # -- trials ------------------------------------------------------------------------------
    def start_trial(
        self, parent_run_id: str, study_name: str, trial_number: int, params: Mapping[str, Any]
    ) -> str:
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"trial-{trial_number:03d}",
            tags={
                "mlflow.parentRunId": parent_run_id,
                "hpo.study_name": study_name,
                "hpo.trial_number": str(trial_number),
                "state": "running",
            },
        )
        run_id = str(run.info.run_id)
        self.log_batch(run_id, params={"trial_number": trial_number, **params})
        return run_id

    def end_trial(
        self,
        run_id: str,
        state: str,
        *,
        metrics: Mapping[str, float] | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        from mlflow.entities import Metric

        final = [Metric(k, float(v), _now_ms(), 0) for k, v in (metrics or {}).items()]
        self.log_batch(run_id, metrics=final, tags={"state": state, **(tags or {})})
        self.client.set_terminated(run_id, status=STATUS[state])

    def log_artifact(self, run_id: str, path: str | Path) -> None:
        self.client.log_artifact(run_id, str(path))

    def finish_parent(self, parent_run_id: str) -> None:
        self.client.set_terminated(parent_run_id, status="FINISHED")


def state_counts(study: optuna.Study) -> dict[str, int]:
    from optuna.trial import TrialState

    names = {
        TrialState.COMPLETE: "complete",
        TrialState.PRUNED: "pruned",
        TrialState.FAIL: "failed",
    }
    counts = dict.fromkeys(names.values(), 0)
    for trial in study.get_trials(deepcopy=False, states=tuple(names)):
        counts[names[trial.state]] += 1
    return counts


def _param_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
