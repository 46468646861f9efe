"""CPU, memory and GPU use of a tracked run, through MLflow's own system-metrics monitor.

MLflow's `SystemMetricsMonitor` samples psutil (CPU, memory, disk, network) and, when NVML is
installed (`pip install -e '.[gpu]'`) and a GPU is present, GPU utilisation and memory, and
logs them as `system/...` metrics of one run. The project creates its runs with its own
writer (`common.mlflow_writer`, no fluent active run), so the monitor is started here for
the run's id, from the start of training to its end. Off when tracking is off; the sampling
interval is a flag (MLflow's `MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL` still wins when set).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

from trainers.events import RunInfo, TrainingCallback
from trainers.result import TrainResult

DEFAULT_INTERVAL_SECONDS = 10.0
log = logging.getLogger(__name__)


class SystemMetrics(TrainingCallback):
    """Samples the machine every `interval_seconds` while the run trains.

    Args:
        tracking_uri: The run's tracking store.
        run: The run id, or the future the project's writer fills with it.
        interval_seconds: Seconds between samples (each sample is logged).
        resume: Continue the `system/` step count of a resumed run.
    """

    def __init__(
        self,
        tracking_uri: str,
        run: str | Future[str],
        *,
        interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
        resume: bool = False,
    ) -> None:
        if not interval_seconds > 0:
            raise ValueError(f"interval_seconds must be > 0, but got {interval_seconds=}")
        self.tracking_uri = tracking_uri
        self.run = run
        self.interval_seconds = interval_seconds
        self.resume = resume
        self.monitor: Any = None

    def on_train_begin(self, info: RunInfo) -> None:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        run_id = self.run.result() if isinstance(self.run, Future) else self.run
        # MLflow logs a line per start and stop at INFO; the run's own log is enough.
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
        self.monitor = SystemMetricsMonitor(
            run_id,
            sampling_interval=self.interval_seconds,
            resume_logging=self.resume,
            tracking_uri=self.tracking_uri,
        )
        self.monitor.start()

    def on_train_end(self, result: TrainResult) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop sampling and send what was sampled (safe to call twice)."""
        if self.monitor is not None:
            self.monitor.finish()
            self.monitor = None
