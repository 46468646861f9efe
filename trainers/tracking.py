"""An MLflow run for a full training (optional: only when a tracking URI is given).

Uses the metric names of the study's trials (`train_loss`, `val_loss`, `tokens_per_second`,
`step_time_s`, `learning_rate`), buffered and sent with `MlflowClient.log_batch`, so a long
run costs a few calls a minute, not one per value. At the end it logs the predicted and the
actual duration. MLflow is imported only when this module is used.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.errors import BadInputError
from common.files import write_atomic
from common.redact import redact
from trainers.events import EvalInfo, Forecast, RunInfo, StepInfo, TrainingCallback
from trainers.result import TrainResult

MAX_METRICS_PER_CALL = 1000  # MLflow's log_batch limits
MAX_PARAMS_PER_CALL = 100
# MLflow run status for each way a run ends.
RUN_STATUS = {
    "finished": "FINISHED",
    "stopped_by_window": "KILLED",
    "stopped_by_signal": "KILLED",
    "stopped": "KILLED",
}


class MlflowRun(TrainingCallback):
    """One MLflow run that follows a training run.

    Args:
        tracking_uri: MLflow tracking URI (``sqlite:///...``, ``http://host:port``).
        experiment_name: Used when `parent_run_id` is not in this store.
        run_name: Name shown in the runs table.
        params: Logged once (the run's settings).
        tags: Set on the run (study, parent run id, ...).
        parent_run_id: The study's parent run; the run goes into its experiment.
        predicted_seconds: The preset's estimate, logged next to the actual duration.
        flush_seconds: Longest time metrics wait in the buffer.
        continue_run_id: An earlier run of this training (before a resume): reopened and
            continued when it is in this store, else a new run starts.
        run_id_file: Where the run id is recorded once training begins, for a later resume.

    Raises:
        BadInputError: The tracking store cannot be reached.
    """

    def __init__(
        self,
        tracking_uri: str,
        *,
        experiment_name: str,
        run_name: str,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
        parent_run_id: str | None = None,
        predicted_seconds: float | None = None,
        flush_seconds: float = 30.0,
        continue_run_id: str | None = None,
        run_id_file: Path | None = None,
    ) -> None:
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.predicted_seconds = predicted_seconds
        self.flush_seconds = flush_seconds
        self.buffer: list[Any] = []
        self.last_flush = time.monotonic()
        self.ended = False
        self.run_id_file = run_id_file
        try:
            run = self._continued(continue_run_id)
            self.continued = run is not None
            if run is None:
                experiment_id = self._experiment(experiment_name, parent_run_id)
                run = self.client.create_run(experiment_id, run_name=run_name, tags=dict(tags))
        except Exception as exc:
            shown, reason = redact(tracking_uri), redact(str(exc))
            raise BadInputError(f"cannot use MLflow tracking store {shown}: {reason}") from None
        self.run_id: str = run.info.run_id
        self.experiment_id = str(run.info.experiment_id)
        if not self.continued:  # a continued run has its params (MLflow forbids changing them)
            self._log(params=params)

    def _continued(self, run_id: str | None) -> Any:
        """The earlier run of a resumed training, reopened; None if it is not in this store."""
        if not run_id:
            return None
        try:
            run = self.client.get_run(run_id)
        except Exception:  # tracked in another store before: start a new run
            return None
        if run.info.lifecycle_stage == "deleted":  # deleted in the UI since
            return None
        self.client.update_run(run_id, status="RUNNING")
        return run

    def _experiment(self, name: str, parent_run_id: str | None) -> str:
        if parent_run_id:
            try:
                return str(self.client.get_run(parent_run_id).info.experiment_id)
            except Exception:  # the study tracked elsewhere: fall back to the name
                pass
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return str(experiment.experiment_id)
        # Tells the UI this is model development, so it opens on the runs table.
        return str(
            self.client.create_experiment(name, tags={"mlflow.experimentKind": "finetuning"})
        )

    def _add(self, key: str, value: float, step: int) -> None:
        from mlflow.entities import Metric

        self.buffer.append(Metric(key, float(value), int(time.time() * 1000), step))
        if (
            len(self.buffer) >= MAX_METRICS_PER_CALL
            or time.monotonic() - self.last_flush > self.flush_seconds
        ):
            self.flush()

    def on_train_begin(self, info: RunInfo) -> None:
        # Recorded only once training runs: a start refused for bad input leaves the id of
        # the run a later resume should continue untouched.
        if self.run_id_file is not None:
            self.run_id_file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.run_id_file, json.dumps({"run_id": self.run_id}) + "\n")

    def on_step(self, info: StepInfo) -> None:
        self._add("train_loss", info.loss, info.step)
        self._add("tokens_per_second", info.tokens_per_second, info.step)
        self._add("step_time_s", info.seconds, info.step)
        self._add("learning_rate", info.learning_rate, info.step)

    def on_eval(self, info: EvalInfo) -> None:
        self._add("val_loss", info.loss, info.step)

    def on_checkpoint(self, step: int, path: str, seconds: float) -> None:
        self._add("checkpoint_time_s", seconds, step)

    def on_forecast(self, forecast: Forecast) -> None:
        self._add("predicted_remaining_s", forecast.remaining_seconds, forecast.step)
        self._add("predicted_total_s", forecast.projected_seconds, forecast.step)

    def on_train_end(self, result: TrainResult) -> None:
        final: dict[str, float] = {
            "wall_seconds": result.wall_seconds,
            "actual_seconds": result.cumulative_wall_seconds,
            "final_step": result.final_step,
        }
        if result.final_eval_loss is not None:
            final["val_loss_final"] = result.final_eval_loss
        if self.predicted_seconds:
            final["predicted_seconds"] = self.predicted_seconds
            if result.status == "finished":
                final["actual_over_predicted"] = (
                    result.cumulative_wall_seconds / self.predicted_seconds
                )
        for key, value in final.items():
            self._add(key, value, result.final_step)
        tags = {
            "status": result.status,
            "recoveries": " | ".join(result.recoveries) or "none",
            "checkpoint_dir": result.checkpoint_dir or "",
        }
        if result.resumed_from_step is not None:
            tags["resumed_from_step"] = str(result.resumed_from_step)
        self._log(tags=tags)
        self.end(RUN_STATUS.get(result.status, "FAILED"))

    def end(self, status: str = "FAILED") -> None:
        """Send what is buffered and close the run (also after a crash)."""
        if self.ended:
            return
        self.flush()
        self.client.set_terminated(self.run_id, status=status)
        self.ended = True

    def flush(self) -> None:
        metrics, self.buffer = self.buffer, []
        self.last_flush = time.monotonic()
        for start in range(0, len(metrics), MAX_METRICS_PER_CALL):
            self.client.log_batch(
                self.run_id, metrics=metrics[start : start + MAX_METRICS_PER_CALL]
            )

    def _log(
        self, *, params: Mapping[str, Any] | None = None, tags: Mapping[str, str] | None = None
    ) -> None:
        from mlflow.entities import Param, RunTag

        param_list = [Param(k, str(v)[:6000]) for k, v in (params or {}).items()]
        tag_list = [RunTag(k, str(v)[:5000]) for k, v in (tags or {}).items()]
        for start in range(0, max(len(param_list), len(tag_list)), MAX_PARAMS_PER_CALL):
            self.client.log_batch(
                self.run_id,
                params=param_list[start : start + MAX_PARAMS_PER_CALL],
                tags=tag_list[start : start + MAX_PARAMS_PER_CALL],
            )
