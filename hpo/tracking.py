"""MLflow tracking of a study: one parent run per study, one nested run per trial.

Per-step values are buffered and sent with `log_batch` (at most 1000 metrics a call), so a
trial costs a handful of store calls however long it trains. Those calls run in order on
one background thread: the training loop only enqueues them. (MLflow's own asynchronous
mode covers `log_batch` only; creating and closing runs would still block, and its queue
thread then competes with them for SQLite's write lock.) `Tracker.flush()` waits for all
of it; the study calls it before it reports.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import optuna

from common.errors import BadInputError
from hpo.states import STATE_NAMES, count_states
from hpo.storage import SCHEMA_RACE_ATTEMPTS, lost_schema_race, redact
from trainers.events import EvalInfo, StepInfo, TrainingCallback
from trainers.result import TrainResult

log = logging.getLogger(__name__)
PARENT_ATTR = "mlflow_parent_run_id"
EXPERIMENT_ATTR = "mlflow_experiment_id"
MAX_METRICS_PER_CALL = 1000
MAX_PARAMS_PER_CALL = 100
MAX_TAGS_PER_CALL = 100
# MLflow run status for each trial state: the runs table shows it in its status column.
STATUS = {"complete": "FINISHED", "pruned": "KILLED", "failed": "FAILED"}

RunRef = Future  # a run id that the background writer fills in


def _now_ms() -> int:
    return int(time.time() * 1000)


class TrialMetrics(TrainingCallback):
    """Buffers a trial's per-step metric histories and sends them in batches."""

    def __init__(self, tracker: Tracker, run: RunRef, flush_seconds: float = 30.0) -> None:
        self.tracker = tracker
        self.run = run
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
        if self.buffer:
            self.tracker.log_batch(self.run, metrics=self.buffer)
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
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpo-mlflow")
        self._pending: list[Future[Any]] = []
        for attempt in range(SCHEMA_RACE_ATTEMPTS):
            try:
                # The store creates (and migrates) its tables on first contact.
                self.client = MlflowClient(tracking_uri=tracking_uri)
                self.experiment_id = self._experiment(experiment_name, artifact_dir)
                break
            except Exception as exc:
                if lost_schema_race(exc) and attempt < SCHEMA_RACE_ATTEMPTS - 1:
                    # Workers started together race to create the store's tables or the
                    # experiment; the loser finds them there on a second look.
                    time.sleep(min(2.0, 0.5 * (attempt + 1)))
                    continue
                raise BadInputError(
                    f"cannot use MLflow tracking store {redact(tracking_uri)}: {_first_line(exc)}"
                ) from None

    def _experiment(self, name: str, artifact_dir: str | None) -> str:
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return str(experiment.experiment_id)
        location = None
        if artifact_dir and not self.tracking_uri.startswith(("http://", "https://")):
            location = Path(artifact_dir).resolve().as_uri()
        return str(
            self.client.create_experiment(
                name,
                artifact_location=location,
                # Tells the UI this is model development, so it opens on the runs table.
                tags={"mlflow.experimentKind": "finetuning"},
            )
        )

    # -- the background writer ---------------------------------------------------------------
    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        self._pending = [f for f in self._pending if not f.done() or f.exception()]
        future = self._writer.submit(fn, *args)
        self._pending.append(future)
        return future

    def flush(self) -> None:
        """Wait until everything queued is in the store; raise the first failure."""
        pending, self._pending = self._pending, []
        errors = [f.exception() for f in pending if f.exception() is not None]
        if errors:
            raise errors[0]  # type: ignore[misc]

    def log_batch(
        self,
        run: str | RunRef,
        *,
        metrics: Iterable[Any] = (),
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue metrics, params and tags, sent in as few calls as MLflow's limits allow."""
        self._submit(self._log_batch_now, run, list(metrics), dict(params or {}), dict(tags or {}))

    def _log_batch_now(
        self,
        run: str | RunRef,
        metrics: list[Any],
        params: dict[str, Any],
        tags: dict[str, Any],
    ) -> None:
        from mlflow.entities import Param, RunTag

        run_id = run.result() if isinstance(run, Future) else run
        param_list = [Param(k, _param_value(v)) for k, v in params.items()]
        tag_list = [RunTag(k, str(v)) for k, v in tags.items()]
        while metrics or param_list or tag_list:
            self.client.log_batch(
                run_id,
                metrics=metrics[:MAX_METRICS_PER_CALL],
                params=param_list[:MAX_PARAMS_PER_CALL],
                tags=tag_list[:MAX_TAGS_PER_CALL],
            )
            metrics = metrics[MAX_METRICS_PER_CALL:]
            param_list = param_list[MAX_PARAMS_PER_CALL:]
            tag_list = tag_list[MAX_TAGS_PER_CALL:]

    # -- the study's parent run --------------------------------------------------------------
    def ensure_parent(self, study: optuna.Study, params: Mapping[str, Any]) -> str:
        """The study's parent run, shared by every worker and every resumed run.

        Workers starting at the same moment may each create one; all of them then adopt the
        oldest parent run of the study (ties broken by run id) and the others are deleted,
        so the study keeps exactly one.
        """
        run_id = study.user_attrs.get(PARENT_ATTR)
        if run_id and self._run_exists(run_id):
            self.client.update_run(run_id, status="RUNNING")
            return str(run_id)
        mine = self.client.create_run(
            self.experiment_id,
            run_name=study.study_name,
            tags={"hpo.study_name": study.study_name, "hpo.role": "study"},
        ).info.run_id
        candidates = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`hpo.study_name` = '{study.study_name}' and tags.`hpo.role` = 'study'",
            max_results=100,
        )
        winner = min(candidates, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id
        if winner != mine:
            self.client.delete_run(mine)
        else:
            self.log_batch(mine, params=params)
        study.set_user_attr(PARENT_ATTR, winner)
        study.set_user_attr(EXPERIMENT_ATTR, self.experiment_id)
        return str(winner)

    def reconcile(self, parent_run_id: str, study: optuna.Study) -> int:
        """Close trial runs left open by a worker that died or was interrupted.

        Optuna is the record of what happened (with heartbeats, a dead worker's trial is
        failed and retried); its state is copied onto the run. Returns how many were closed.
        """
        self.flush()
        open_runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.state = 'running'",
            max_results=1000,
        )
        trials = {t.number: t for t in study.get_trials(deepcopy=False)}
        closed = 0
        for run in open_runs:
            trial = trials.get(int(run.data.tags.get("hpo.trial_number", -1)))
            if trial is None or trial.state not in STATE_NAMES:
                continue  # still running in some worker
            state = STATE_NAMES[trial.state]
            reason = (
                trial.user_attrs.get("state_reason") or "the worker stopped before recording it"
            )
            self.end_trial(run.info.run_id, state, tags={"reason": reason})
            closed += 1
        self.flush()
        return closed

    def _run_exists(self, run_id: str) -> bool:
        try:
            self.client.get_run(run_id)
            return True
        except Exception:
            return False

    def update_parent(self, parent_run_id: str, study: optuna.Study) -> None:
        """Queue the parent's best value so far and counts per state (read from the study)."""
        self._submit(self._update_parent_now, parent_run_id, study)

    def _update_parent_now(self, parent_run_id: str, study: optuna.Study) -> None:
        from mlflow.entities import Metric

        trials = study.get_trials(deepcopy=False, states=tuple(STATE_NAMES))
        counts = count_states(trials)
        finished = len(trials)
        now = _now_ms()
        metrics = [Metric(f"n_{k}", float(v), now, finished) for k, v in counts.items()]
        tags: dict[str, Any] = {}
        complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
        if complete:
            best = min(complete, key=lambda t: float(t.value))  # type: ignore[arg-type]
            metrics.append(Metric("best_value", float(best.value), now, finished))  # type: ignore[arg-type]
            tags["best_trial"] = best.number
        self._log_batch_now(parent_run_id, metrics, {}, tags)

    # -- trials ------------------------------------------------------------------------------
    def start_trial(
        self, parent_run_id: str, study_name: str, trial_number: int, params: Mapping[str, Any]
    ) -> RunRef:
        """Queue the trial's nested run; the returned future holds its run id."""
        tags = {
            "mlflow.parentRunId": parent_run_id,
            "hpo.study_name": study_name,
            "hpo.trial_number": str(trial_number),
            "state": "running",
        }

        def create() -> str:
            run = self.client.create_run(
                self.experiment_id, run_name=f"trial-{trial_number:03d}", tags=tags
            )
            return str(run.info.run_id)

        run = self._submit(create)
        self.log_batch(run, params={"trial_number": trial_number, **params})
        return run

    def end_trial(
        self,
        run: str | RunRef,
        state: str,
        *,
        metrics: Mapping[str, float] | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        from mlflow.entities import Metric

        final = [Metric(k, float(v), _now_ms(), 0) for k, v in (metrics or {}).items()]
        self.log_batch(run, metrics=final, tags={"state": state, **(tags or {})})

        def close() -> None:
            run_id = run.result() if isinstance(run, Future) else run
            self.client.set_terminated(run_id, status=STATUS[state])

        self._submit(close)

    def log_artifact(self, run_id: str, path: str | Path) -> None:
        self.flush()
        self.client.log_artifact(run_id, str(path))

    def finish_parent(self, parent_run_id: str) -> None:
        self.flush()
        self.client.set_terminated(parent_run_id, status="FINISHED")


def _first_line(exc: Exception) -> str:
    return redact(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__


def _param_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
