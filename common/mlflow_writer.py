"""The project's one MLflow writer: ordered, batched, in the background, with secrets redacted.

Used by the study (a parent run, one nested run per trial) and by a full training run. Writes
(`log_batch`, `set_terminated`, anything given to `submit`) run in order on one background
thread, so a training loop only enqueues them; `flush()` waits for all of it and raises the
first failure. (MLflow's own asynchronous mode covers `log_batch` only; creating and closing
runs would still block, and its queue thread then competes with them for SQLite's write
lock.) Batches are split by MLflow's per-call limits here and nowhere else. Param and tag
values pass through `redact`, so a password inside a URL never reaches the store.

MLflow is imported inside the functions that use it: importing this module is cheap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from common.errors import BadInputError
from common.redact import redact
from common.retry import retry_schema_race

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Metric

# MLflow's limits for one log_batch call, and for one value.
MAX_METRICS_PER_CALL = 1000
MAX_PARAMS_PER_CALL = 100
MAX_TAGS_PER_CALL = 100
MAX_PARAM_LENGTH = 6000
MAX_TAG_LENGTH = 5000

T = TypeVar("T")
RunRef: TypeAlias = Future[str]  # a run id that the background writer fills in
Run: TypeAlias = str | RunRef  # a run id, or one still being created in the background


def metric(key: str, value: float, step: int) -> Metric:
    """One value of metric `key` at `step`, stamped now."""
    from mlflow.entities import Metric

    return Metric(key, float(value), int(time.time() * 1000), step)


class MlflowWriter:
    """One `MlflowClient` (no global active-run state) and the thread that writes through it.

    Args:
        tracking_uri: MLflow tracking URI (``sqlite:///...``, ``http://host:port``, ...).

    Raises:
        BadInputError: The tracking store cannot be used.
    """

    def __init__(self, tracking_uri: str) -> None:
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri
        if tracking_uri.startswith("sqlite:///"):
            Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-writer")
        self._pending: list[Future[Any]] = []
        # The store creates (and migrates) its tables on first contact.
        self.client: MlflowClient = self.setup(lambda: MlflowClient(tracking_uri=tracking_uri))

    def setup(self, fn: Callable[[], T]) -> T:
        """Run one set-up step against the store now (open it, find or create a run).

        Workers starting together race to create the store's tables or experiment; a lost
        race is retried. Any other failure means this store cannot be used.

        Raises:
            BadInputError: Naming the store (password hidden) and the first line of the error.
        """
        try:
            return retry_schema_race(fn)
        except Exception as exc:
            raise BadInputError(
                f"cannot use MLflow tracking store {redact(self.tracking_uri)}: {_first_line(exc)}"
            ) from None

    def experiment(self, name: str, *, artifact_dir: str | None = None) -> str:
        """The id of experiment `name`, created when missing.

        Args:
            name: Experiment name.
            artifact_dir: Where a new experiment keeps its artifacts; ignored for HTTP stores
                (the server decides).

        Raises:
            BadInputError: The store cannot be used.
        """

        def get_or_create() -> str:
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

        return self.setup(get_or_create)

    def create_run(self, experiment_id: str, *, run_name: str, tags: Mapping[str, Any]) -> str:
        """Create a run now and return its id (give it to `submit` to create it in the background)."""
        run = self.client.create_run(
            experiment_id, run_name=run_name, tags={k: _tag_value(v) for k, v in tags.items()}
        )
        return str(run.info.run_id)

    # -- the background writer ---------------------------------------------------------------
    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Queue `fn(*args, **kwargs)` behind everything queued before it."""
        # Finished futures are dropped, failed ones kept until `flush` raises them.
        self._pending = [f for f in self._pending if not f.done() or f.exception()]
        future = self._executor.submit(fn, *args, **kwargs)
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
        run: Run,
        *,
        metrics: Iterable[Metric] = (),
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue metrics, params and tags, sent in as few calls as MLflow's limits allow."""
        self.submit(self.write_batch, run, list(metrics), dict(params or {}), dict(tags or {}))

    def write_batch(
        self,
        run: Run,
        metrics: Iterable[Metric] = (),
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        """Send at once, on the caller's thread (`log_batch` queues this on the writer's)."""
        from mlflow.entities import Param, RunTag

        run_id = _run_id(run)
        metric_list = list(metrics)
        param_list = [Param(k, _param_value(v)) for k, v in (params or {}).items()]
        tag_list = [RunTag(k, _tag_value(v)) for k, v in (tags or {}).items()]
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

    def set_terminated(self, run: Run, status: str) -> None:
        """Queue closing the run with MLflow `status` (FINISHED, KILLED, FAILED)."""
        self.submit(lambda: self.client.set_terminated(_run_id(run), status=status))

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file, or a folder's files, to the run after everything queued before it."""
        self.flush()
        if Path(path).is_dir():
            self.client.log_artifacts(run_id, str(path), artifact_path=artifact_path)
        else:
            self.client.log_artifact(run_id, str(path), artifact_path=artifact_path)


def _run_id(run: Run) -> str:
    # Runs created through `submit` were queued first, so on the writer's thread they are done.
    return run.result() if isinstance(run, Future) else run


def _param_value(value: Any) -> str:
    text = f"{value:.6g}" if isinstance(value, float) else str(value)
    return redact(text)[:MAX_PARAM_LENGTH]


def _tag_value(value: Any) -> str:
    return redact(str(value))[:MAX_TAG_LENGTH]


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return redact(text.splitlines()[0]) if text else type(exc).__name__
