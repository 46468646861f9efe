"""A training run's metrics in MLflow: the per-step histories, and the run of a full training.

`StepMetrics` holds the metric names every tracked training uses (a study's trials and a
full run alike, so their curves line up in the UI) and sends them through the project's
`MlflowWriter` in batches, so a long run costs a few store calls a minute, not one per value.
`MlflowRun` is the full training's run (optional: only when a tracking URI is given). MLflow
is imported only when these classes are used.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.files import write_atomic
from common.mlflow_store import MAX_METRICS_PER_CALL, metric, stored_run
from common.mlflow_writer import MlflowWriter, Run
from common.outage import TrackingUnreachable
from trainers.events import EvalInfo, Forecast, RunInfo, StepInfo, TrainingCallback
from trainers.result import TrainResult
from trainers.spec import TrainSpec

log = logging.getLogger(__name__)
# MLflow run status for each way a run ends.
REPORT_ARTIFACT = "result.json"  # the full run's report, beside its metrics
RUN_STATUS = {
    "finished": "FINISHED",
    "stopped_by_window": "KILLED",
    "stopped_by_signal": "KILLED",
    "stopped": "KILLED",
    "stopped_early": "FINISHED",
}


class StepMetrics(TrainingCallback):
    """Buffers a run's per-step metric histories and queues them on the writer in batches.

    Per optimizer step: `train_loss`, `tokens_per_second`, `step_time_s`, `learning_rate`,
    `grad_norm` (before clipping); per evaluation: `val_loss`, `train_val_gap`. The buffer goes
    out when it holds one call's worth, when it
    is older than `flush_seconds`, and when training ends.

    Args:
        writer: The writer that sends the batches.
        run: The run id, or the future that will hold it.
        flush_seconds: Longest time metrics wait in the buffer.
    """

    def __init__(self, writer: MlflowWriter, run: Run, *, flush_seconds: float = 30.0) -> None:
        self.writer = writer
        self.run = run
        self.flush_seconds = flush_seconds
        self.buffer: list[Any] = []
        self.last_flush = time.monotonic()

    def add(self, key: str, value: float, step: int) -> None:
        """Buffer one value of metric `key` at `step`."""
        self.buffer.append(metric(key, value, step))
        if (
            len(self.buffer) >= MAX_METRICS_PER_CALL
            or time.monotonic() - self.last_flush > self.flush_seconds
        ):
            self.flush()

    def on_step(self, info: StepInfo) -> None:
        self.add("train_loss", info.loss, info.step)
        self.add("tokens_per_second", info.tokens_per_second, info.step)
        self.add("step_time_s", info.seconds, info.step)
        self.add("learning_rate", info.learning_rate, info.step)
        if info.grad_norm is not None:
            self.add("grad_norm", info.grad_norm, info.step)

    def on_eval(self, info: EvalInfo) -> None:
        self.add("val_loss", info.loss, info.step)
        if info.train_val_gap is not None:
            self.add("train_val_gap", info.train_val_gap, info.step)

    def on_train_end(self, result: TrainResult) -> None:
        self.flush()

    def flush(self) -> None:
        """Queue what is buffered (the writer's `flush` waits until it is stored)."""
        if self.buffer:
            self.writer.log_batch(self.run, metrics=self.buffer)
        self.buffer = []
        self.last_flush = time.monotonic()


class MlflowRun(StepMetrics):
    """One MLflow run that follows a full training run.

    Besides the per-step histories it records checkpoint times and the running forecast, and
    at the end the predicted and the actual duration.

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
            continued when it is in this store, else a new run starts (a server that does
            not answer is neither: see Raises).
        run_id_file: Where the run id is recorded once training begins, for a later resume.
        spool_dir: Where records wait while the tracking server does not answer mid-run
            (sent when it answers again, or by ``python -m hpo.tracking --replay DIR``).

    Raises:
        BadInputError: The tracking store cannot be used (a server that does not answer at
            start included: one line, within seconds).
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
        spool_dir: Path | None = None,
    ) -> None:
        writer = MlflowWriter(tracking_uri, spool_root=spool_dir)
        try:
            run_id = writer.setup(lambda: _reopen(writer, continue_run_id))
            self.continued = run_id is not None
            if run_id is None:
                experiment_id = writer.setup(
                    lambda: _parent_experiment(writer, parent_run_id)
                ) or writer.experiment(experiment_name)
                run_id = writer.setup(
                    lambda: writer.create_run(experiment_id, run_name=run_name, tags=tags)
                )
        except TrackingUnreachable as exc:
            raise TrackingUnreachable(
                f"{exc}: start it, or pass --tracking-uri off to train without MLflow"
            ) from None
        super().__init__(writer, run_id, flush_seconds=flush_seconds)
        self.run_id: str = run_id
        self.predicted_seconds = predicted_seconds
        self.run_id_file = run_id_file
        self.ended = False
        if not self.continued:  # a continued run has its params (MLflow forbids changing them)
            writer.log_batch(run_id, params=params)

    def on_train_begin(self, info: RunInfo) -> None:
        # Recorded only once training runs: a start refused for bad input leaves the id of
        # the run a later resume should continue untouched.
        if self.run_id_file is not None:
            write_atomic(self.run_id_file, json.dumps({"run_id": self.run_id}) + "\n")

    def on_checkpoint(self, step: int, path: str, seconds: float) -> None:
        self.add("checkpoint_time_s", seconds, step)

    def on_forecast(self, forecast: Forecast) -> None:
        self.add("predicted_remaining_s", forecast.remaining_seconds, forecast.step)
        self.add("predicted_total_s", forecast.projected_seconds, forecast.step)

    def on_train_end(self, result: TrainResult) -> None:
        final: dict[str, float] = {
            "wall_seconds": result.wall_seconds,
            "actual_seconds": result.cumulative_wall_seconds,
            "final_step": result.final_step,
        }
        if result.final_eval_loss is not None:
            final["val_loss_final"] = result.final_eval_loss
        if result.best_val_loss is not None and result.best_step is not None:
            # The checkpoint a run that stopped early keeps: its study reads it as the
            # configuration's loss (hpo.full_run_reports).
            final["val_loss_best"] = result.best_val_loss
            final["best_step"] = result.best_step
        if self.predicted_seconds:
            final["predicted_seconds"] = self.predicted_seconds
            if result.status == "finished":
                final["actual_over_predicted"] = (
                    result.cumulative_wall_seconds / self.predicted_seconds
                )
        for key, value in final.items():
            self.add(key, value, result.final_step)
        tags = {
            "status": result.status,
            "recoveries": " | ".join(result.recoveries) or "none",
            "checkpoint_dir": result.checkpoint_dir or "",
        }
        if result.resumed_from_step is not None:
            tags["resumed_from_step"] = str(result.resumed_from_step)
        if result.best_checkpoint:
            tags["best_checkpoint"] = result.best_checkpoint
        tags.update(advice_tags(result.advice))
        self.writer.log_batch(self.run_id, tags=tags)
        self.end(RUN_STATUS.get(result.status, "FAILED"))

    def attach_report(self, report: Mapping[str, Any]) -> None:
        """Attach the run's report (`result.json`) and its predicted final loss to the run.

        The study that exported the preset reads it back to calibrate its predictions. A run
        that changed what its loss depends on (`preset_departures`) is not the run predicted:
        no predicted loss beside it.
        """
        from trainers.preset import changes_the_loss

        departed = changes_the_loss(report.get("preset_departures"))
        loss = {} if departed else (report.get("estimate") or {}).get("final_val_loss") or {}
        metrics = {
            f"predicted_final_val_loss_{q}": float(loss[q])
            for q in ("p10", "p50", "p90")
            if q in loss
        }
        if metrics:
            self.writer.log_batch(
                self.run_id, metrics=[metric(k, v, 0) for k, v in metrics.items()]
            )
        with tempfile.TemporaryDirectory(prefix="hpo-report-") as folder:
            path = Path(folder) / REPORT_ARTIFACT
            path.write_text(json.dumps(report, default=str), encoding="utf-8")
            self.writer.log_artifact(self.run_id, path)

    def log_adapter(
        self,
        result: TrainResult,
        spec: TrainSpec,
        *,
        provenance: Mapping[str, Any],
        register_as: str | None = None,
    ) -> None:
        """Log the run's final adapter as the run's MLflow model; register it when named.

        Adapter weights only, the base model named by its path (`trainers.adapter_model`).
        """
        from trainers.adapter_model import (
            ADAPTER_MODEL_NAME,
            MODEL_FOLDER,
            final_adapter,
            save_adapter_model,
        )

        adapter = final_adapter(result.best_checkpoint, result.checkpoint_dir)
        if adapter is None:
            log.warning("no adapter checkpoint in %s: no MLflow model logged", spec.output_dir)
            return
        folder = save_adapter_model(adapter, spec.model, Path(spec.output_dir) / MODEL_FOLDER)
        tags = {
            "base_model": str(Path(spec.model).resolve()),
            "adapter_checkpoint": str(adapter),
            "study": provenance.get("study", ""),
            "trial": provenance.get("trial", ""),
            "final_eval_loss": result.final_eval_loss if result.final_eval_loss is not None else "",
        }
        self.writer.log_model(
            self.run_id,
            folder,
            name=ADAPTER_MODEL_NAME,
            tags={k: v for k, v in tags.items() if v != ""},
            step=result.final_step,
            register_as=register_as,
        )

    def end(self, status: str = "FAILED") -> None:
        """Send what is buffered and close the run (also after a crash), then wait for both.

        Raises:
            Exception: The first write that failed; the run is closed all the same.
        """
        if self.ended:
            return
        self.ended = True
        self.flush()
        self.writer.set_terminated(self.run_id, status)
        self.writer.flush()

    def close(self) -> int:
        """Stop the writer; returns the records still waiting for the server (logged)."""
        return self.writer.close()


def advice_tags(advice: list[str]) -> dict[str, str]:
    """`advice.overfitting`, `advice.not_learning`: one tag per line, keyed by its kind."""
    return {f"advice.{line.split(':', 1)[0].replace(' ', '_')}": line for line in advice}


def _reopen(writer: MlflowWriter, run_id: str | None) -> str | None:
    """The earlier run of a resumed training, reopened; None if it is not in this store."""
    if not run_id:
        return None
    run = stored_run(writer.client, run_id)
    # Tracked in another store before, or deleted in the UI since: a new run starts.
    if run is None or run.info.lifecycle_stage == "deleted":
        return None
    writer.client.update_run(run_id, status="RUNNING")
    return run_id


def _parent_experiment(writer: MlflowWriter, parent_run_id: str | None) -> str | None:
    """The experiment of the study's parent run, when that run is in this store."""
    if not parent_run_id:
        return None
    run = stored_run(writer.client, parent_run_id)
    # The study tracked elsewhere: the caller falls back to the experiment name.
    return None if run is None else str(run.info.experiment_id)
