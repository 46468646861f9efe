"""CPU, memory and GPU use of a tracked run, read by MLflow's collectors, sent by our writer.

MLflow's metric collectors (`mlflow.system_metrics.metrics`: CPU and memory, disk, network
through psutil; NVIDIA or AMD GPU utilisation and memory when NVML / ROCm SMI is installed,
`pip install -e '.[gpu]'`) take the readings. MLflow's own `SystemMetricsMonitor` is not
used: it sends through a client of its own, asks the server every sample whether the run
is still RUNNING and stops for good on the first failure, so a tracking server that goes
away loses the samples, and one that hangs holds the trial in `finish()` for its HTTP
timeout. Here a daemon thread takes a reading every `interval_seconds` and queues it as
`system/...` metrics on the project's one writer (`common.mlflow_writer`), which keeps
them in order with the run's other records and spools them while the server is away;
queuing never waits for the server, and `stop()` waits for the sampler a bounded time.
MLflow's `MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL` and `MLFLOW_SYSTEM_METRICS_NODE_ID`
still apply when set.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any

from common.mlflow_store import batch_record, metric
from common.mlflow_writer import MlflowWriter, Run
from trainers.events import RunInfo, TrainingCallback
from trainers.result import TrainResult

DEFAULT_INTERVAL_SECONDS = 10.0
PREFIX = "system/"
# Longest wait in `stop()` for a reading in progress (psutil and NVML answer in milliseconds).
STOP_WAIT_SECONDS = 2.0
log = logging.getLogger(__name__)


class SystemMetrics(TrainingCallback):
    """Samples the machine every `interval_seconds` while the run trains.

    The first reading is taken one interval after training begins and the last one when
    it ends, so even a run shorter than one interval has one.

    Args:
        writer: The writer that holds the run (its records are queued there, never sent here).
        run: The run id, or the future the writer fills with it.
        interval_seconds: Seconds between samples (each sample is logged).
        resume: Continue the `system/` step count of a resumed run.
    """

    def __init__(
        self,
        writer: MlflowWriter,
        run: Run,
        *,
        interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
        resume: bool = False,
    ) -> None:
        if not interval_seconds > 0:
            raise ValueError(f"interval_seconds must be > 0, but got {interval_seconds=}")
        self.writer = writer
        self.run = run
        self.interval_seconds = _env_float("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL") or float(
            interval_seconds
        )
        self.resume = resume
        node = os.environ.get("MLFLOW_SYSTEM_METRICS_NODE_ID")
        self.prefix = PREFIX + (f"{node}/" if node else "")
        self.samples = 0  # readings queued on the writer
        self._step = 0
        self._monitors: list[Any] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False

    def on_train_begin(self, info: RunInfo) -> None:
        self.start()

    def on_train_end(self, result: TrainResult) -> None:
        self.stop()

    def start(self) -> None:
        """Start sampling on a daemon thread (no call to the tracking server here)."""
        if self._thread is not None:
            return
        self._monitors = collectors()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="hpo-system-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Queue a last reading and stop sampling (safe to call twice; waits seconds at most)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=STOP_WAIT_SECONDS)
        if thread.is_alive():
            log.warning("system metrics: the sampler did not stop within %.0f s", STOP_WAIT_SECONDS)

    def _loop(self) -> None:
        if self.resume:
            self._step = _next_step(self.writer, self.run, self.prefix)
        for monitor in self._monitors:  # psutil's CPU share counts from its previous call
            with contextlib.suppress(Exception):
                monitor.collect_metrics()
                monitor.clear_metrics()
        while not self._stop.wait(self.interval_seconds):
            self._sample()
        self._sample()  # the last interval, cut short by the end of training

    def _sample(self) -> None:
        values: dict[str, float] = {}
        for monitor in self._monitors:
            try:
                monitor.collect_metrics()
                values.update(monitor.aggregate_metrics())
            except Exception as exc:  # a reading lost is no reason to stop the others
                log.debug("system metrics: %s failed: %s", type(monitor).__name__, exc)
            finally:
                monitor.clear_metrics()
        if not values:
            return
        batch = [metric(self.prefix + k, float(v), self._step) for k, v in values.items()]
        self._step += 1
        try:
            self.writer.submit(self._write, batch)
        except RuntimeError:  # the writer was closed meanwhile: nothing left to write into
            return
        self.samples += 1

    def _write(self, batch: list[Any]) -> None:
        """On the writer's thread: send or spool; a refused sample costs a warning, once."""
        try:
            self.writer.write(self.run, batch_record(batch))
        except Exception as exc:
            if not self._failed:
                self._failed = True
                log.warning("system metrics not recorded: %s", str(exc).splitlines()[0][:200])


def collectors() -> list[Any]:
    """MLflow's collectors for this machine: CPU and memory, disk, network, a GPU if any."""
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
    from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor

    found: list[Any] = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
    gpu = _gpu_collector()
    if gpu is not None:
        found.append(gpu)
    return found


def _gpu_collector() -> Any:
    """NVIDIA's (NVML) or AMD's (ROCm SMI) collector; None without a GPU or its library."""
    from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor
    from mlflow.system_metrics.metrics.rocm_monitor import ROCMMonitor

    for kind in (GPUMonitor, ROCMMonitor):
        try:
            return kind()
        except Exception:  # no library, or no device: try the next kind
            continue
    return None


def _next_step(writer: MlflowWriter, run: Run, prefix: str) -> int:
    """After a resume: one past the run's last `system/` step (0 when it cannot be read)."""
    try:
        run_id = writer.resolve(run.result(timeout=10) if not isinstance(run, str) else run)
        metrics = writer.client.get_run(run_id).data._metric_objs
    except Exception:  # the server away: the steps restart at 0, the readings are kept
        return 0
    steps = [m.step for m in metrics if m.key.startswith(prefix)]
    return max(steps) + 1 if steps else 0


def _env_float(name: str) -> float | None:
    text = os.environ.get(name)
    try:
        return float(text) if text else None
    except ValueError:
        return None
