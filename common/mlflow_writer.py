"""The project's one MLflow writer: ordered, batched, in the background, with secrets redacted.

Used by the study (a parent run, one nested run per trial) and by a full training run. Writes
(`log_batch`, `set_terminated`, anything given to `submit`) run in order on one background
thread, so a training loop only enqueues them; `flush()` waits for all of it and raises the
first failure. (MLflow's own asynchronous mode covers `log_batch` only; creating and closing
runs would still block, and its queue thread then competes with them for SQLite's write
lock.) Each write is a record (`common.mlflow_store`), sent by the store or spooled.

A tracking server that stops answering is no reason to lose a record or to stall a study:
what it does not take waits in order in an on-disk spool (`common.spool`) and is sent once
it answers again (tried with back-off), or later by `python -m hpo.tracking --replay DIR`.
MLflow's HTTP client would otherwise retry a refused connection for minutes; an HTTP writer
sets `MLFLOW_HTTP_REQUEST_MAX_RETRIES=0` and a 30 s timeout unless the environment says else.

MLflow is imported inside the functions that use it: importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from common import mlflow_seed
from common.errors import BadInputError
from common.mlflow_seed import sqlite_path
from common.mlflow_store import (
    MlflowStore,
    batch_record,
    client_id,
    first_line,
    now_ms,
    tag_values,
)
from common.outage import (
    TrackingUnreachable,
    answers,
    fail_fast_http,
    is_http,
    is_outage,
    outage_reason,
)
from common.redact import redact
from common.retry import retry_schema_race
from common.spool import Spool

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Metric

log = logging.getLogger(__name__)

T = TypeVar("T")
RunRef: TypeAlias = Future[str]  # a run id that the background writer fills in
Run: TypeAlias = str | RunRef  # a run id, or one still being created in the background


class MlflowWriter:
    """One `MlflowClient` (no global active-run state) and the thread that writes through it.

    With a `spool_root`, a tracking server that stops answering costs the run nothing: each
    record from then on is appended to an on-disk spool (`common.spool`) in order, and sent
    from there, oldest first, once the server answers again (tried again with back-off).
    Records are idempotent, so one sent twice (a reply lost with the server) changes nothing:
    MLflow keeps one copy of a metric with the same key, step, timestamp and value; params and
    tags are rewritten with their own values; a run created from the spool carries a
    client-side id (tag `hpo.client_run_id`) and is looked up by it before it is created.

    Args:
        tracking_uri: MLflow tracking URI (``sqlite:///...``, ``http://host:port``, ...).
        spool_root: Where records wait while the server does not answer (one folder per
            process); None: a failed write is raised by `flush` as any other failure.
        backoff: First and longest wait in seconds between tries to reach the server.

    Raises:
        BadInputError: The tracking store cannot be used.
    """

    def __init__(
        self,
        tracking_uri: str,
        *,
        spool_root: str | Path | None = None,
        backoff: tuple[float, float] = (1.0, 30.0),
    ) -> None:
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri
        if tracking_uri.startswith("sqlite:///"):
            Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        if is_http(tracking_uri):
            fail_fast_http()
        self.spool_root = Path(spool_root) if spool_root is not None else None
        self.spool: Spool | None = None  # opened on the first write the server does not take
        self.spooled = 0  # records that waited in the spool, in this process
        self._backoff = backoff
        self._delay = backoff[0]
        self._next_try = 0.0
        self._timer: threading.Timer | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-writer")
        self._pending: list[Future[Any]] = []
        # The store creates (and migrates) its tables on first contact; a new SQLite store
        # starts as a copy of the empty one MLflow made here before (`common.mlflow_seed`).
        path = sqlite_path(tracking_uri)
        fresh = path is not None and not path.exists() and not mlflow_seed.seed(path)
        client = self.setup(lambda: MlflowClient(tracking_uri=tracking_uri))
        if fresh and path is not None:
            mlflow_seed.keep(path)
        self.store = MlflowStore(client, tracking_uri)

    @property
    def client(self) -> MlflowClient:
        """The store's client, for reads (search, get) and set-up steps."""
        return self.store.client

    def setup(self, fn: Callable[[], T]) -> T:
        """Run one set-up step against the store now (open it, find or create a run).

        Workers starting together race to create the store's tables or experiment; a lost
        race is retried. Any other failure means this store cannot be used.

        Raises:
            TrackingUnreachable: A tracking server that does not answer (seconds, not minutes).
            BadInputError: Naming the store (password hidden) and the first line of the error.
        """
        try:
            return retry_schema_race(fn)
        except Exception as exc:
            if is_outage(exc):
                raise TrackingUnreachable(
                    f"MLflow tracking server {redact(self.tracking_uri)} does not answer "
                    f"({outage_reason(exc)})"
                ) from None
            raise BadInputError(
                f"cannot use MLflow tracking store {redact(self.tracking_uri)}: {first_line(exc)}"
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
        return self.setup(lambda: self.store.experiment(name, artifact_dir))

    def experiment_later(self, name: str, *, artifact_dir: str | None = None) -> str:
        """A client-side id for experiment `name`, found or created once the server answers.

        For a start while the server is away: runs created with this id go into it.
        """
        ref = client_id("exp")
        record = {"op": "experiment", "client_id": ref, "name": name, "dir": artifact_dir}
        self.submit(self._handle, record).result()
        return self.resolve(ref)

    def create_run(self, experiment_id: str, *, run_name: str, tags: Mapping[str, Any]) -> str:
        """Create a run now and return its id (`create_run_later` queues it instead)."""
        run = self.client.create_run(
            self.resolve(experiment_id), run_name=run_name, tags=tag_values(tags)
        )
        return str(run.info.run_id)

    def create_run_later(
        self, experiment_id: str, run_name: str, tags: Mapping[str, Any], adopt: str | None = None
    ) -> RunRef:
        """Queue creating a run; the future holds its id once the writer has handled it.

        That id is the store's, or a client-side one while the run waits in the spool;
        records for either id reach the same run.

        Args:
            experiment_id: The run's experiment (a client-side id from `experiment_later` too).
            run_name: Name shown in the runs table.
            tags: The run's tags (redacted).
            adopt: A `search_runs` filter: a run created from the spool becomes the oldest
                run this filter finds instead, when there is one (the study's one parent).
        """
        ref = client_id("run")
        record = {
            "op": "create_run",
            "client_id": ref,
            "experiment_id": experiment_id,
            "run_name": run_name,
            "tags": tag_values(tags),
            "start_time": now_ms(),
            "adopt": adopt,
        }
        created = self.submit(self._create_and_resolve, record)
        setattr(created, _CLIENT_ID_ATTR, ref)  # for `run_id_now`
        if not self.waiting:
            return created
        # While records wait in the spool this one waits too: its client-side id is known now,
        # and a caller that needs the id does not wait behind the writer's tries.
        now: RunRef = Future()
        now.set_result(ref)
        return now

    def resolve(self, ref: str) -> str:
        """The store's id for `ref` once known (a client-side id until then)."""
        return self.store.resolve(ref)

    # -- the background writer ---------------------------------------------------------------
    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Queue `fn(*args, **kwargs)` behind everything queued before it."""
        with self._lock:
            # Finished futures are dropped, failed ones kept until `flush` raises them.
            self._pending = [f for f in self._pending if not f.done() or f.exception()]
            future = self._executor.submit(fn, *args, **kwargs)
            self._pending.append(future)
        return future

    def flush(self) -> None:
        """Wait until everything queued is in the store or the spool; raise the first failure."""
        with self._lock:
            pending, self._pending = self._pending, []
        errors = [f.exception() for f in pending if f.exception() is not None]
        if errors:
            raise errors[0]  # type: ignore[misc]

    @property
    def waiting(self) -> int:
        """Records in the spool, not yet in the store."""
        return self.spool.waiting if self.spool is not None else 0

    def log_batch(
        self,
        run: Run,
        *,
        metrics: Iterable[Metric] = (),
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue metrics, params and tags, sent in as few calls as MLflow's limits allow."""
        self.submit(self.write, run, batch_record(metrics, params, tags))

    def write(self, run: Run, record: dict[str, Any]) -> None:
        """Send a record for `run` now, or spool it (on the writer's thread only: the methods
        that queue call it there; a job given to `submit` may call it too)."""
        self._handle({**record, "run": self.resolve(_run_id(run))})

    def set_terminated(self, run: Run, status: str) -> None:
        """Queue closing the run with MLflow `status` (FINISHED, KILLED, FAILED), stamped now."""
        record = {"op": "terminate", "status": status, "end_time": now_ms()}
        self.submit(self.write, run, record)

    def update_run(self, run: Run, status: str) -> None:
        """Queue setting the run's status (RUNNING to reopen it)."""
        self.submit(self.write, run, {"op": "status", "status": status})

    def log_artifact(self, run_id: Run, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file, or a folder's files, after everything queued before it, and wait.

        Spooled, a copy of them waits in the spool (the caller may delete the originals).
        """
        record = {
            "op": "artifact",
            "path": str(Path(path).resolve()),
            "artifact_path": artifact_path,
        }
        self.submit(self.write, run_id, record)
        self.flush()

    def log_input(self, run: Run, dataset: Mapping[str, str], context: str = "training") -> None:
        """Queue an MLflow dataset input (`mlflow.entities.Dataset` fields as strings) on a run."""
        self.submit(self.write, run, {"op": "input", "dataset": dict(dataset), "context": context})

    def log_model(
        self,
        run: Run,
        path: str | Path,
        *,
        name: str,
        tags: Mapping[str, Any],
        step: int = 0,
        register_as: str | None = None,
    ) -> None:
        """Log a saved MLflow model folder as a LoggedModel of `run` (and register it), and wait.

        Spooled, a copy of the folder waits in the spool, like an artifact.
        """
        record = {
            "op": "model",
            "path": str(Path(path).resolve()),
            "name": name,
            "tags": tag_values(tags),
            "step": step,
            "register_as": register_as,
        }
        self.submit(self.write, run, record)
        self.flush()

    def send_waiting(self) -> int:
        """Try now to send what waits in the spool (after what is queued); returns what still waits."""
        if self.spool is not None and self.spool.waiting:
            self.submit(self._drain).result()
        return self.waiting

    def close(self) -> int:
        """Try once more to send what waits, stop retrying, and release the spool.

        Returns:
            Records still waiting (in `spool_folder`, for `python -m hpo.tracking --replay`).
        """
        with contextlib.suppress(Exception):
            self.flush()
        self.send_waiting()
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._executor.shutdown(wait=True)
        waiting = self.waiting
        if self.spool is not None:
            if waiting:
                log.warning(
                    "%d MLflow records could not be sent to %s; they wait in %s: send them "
                    "with python -m hpo.tracking --replay %s",
                    waiting,
                    redact(self.tracking_uri),
                    self.spool.folder,
                    self.spool.folder,
                )
            self.spool.close()
        return waiting

    @property
    def spool_folder(self) -> Path | None:
        """This writer's spool folder, once it has one."""
        return self.spool.folder if self.spool is not None else None

    # -- records: sent, or spooled -----------------------------------------------------------
    def _create_and_resolve(self, record: dict[str, Any]) -> str:
        self._handle(record)
        return self.resolve(record["client_id"])

    def _handle(self, record: dict[str, Any]) -> None:
        """Send `record`, or append it to the spool (on the writer's thread only)."""
        if self.spool is not None and self.spool.waiting:
            self._to_spool(record)  # behind what waits: order is kept
            if time.monotonic() >= self._next_try:
                self._drain()
            return
        try:
            self.store.send(record)
        except Exception as exc:
            if self.spool_root is None or not is_outage(exc):
                raise
            if self.spool is None:
                self.spool = Spool.new(self.spool_root, self.tracking_uri)
            log.warning(
                "MLflow tracking server %s does not answer (%s): records wait in %s and are "
                "sent when it answers again",
                redact(self.tracking_uri),
                outage_reason(exc),
                self.spool_folder,
            )
            self._to_spool(record)
            self._retry_later()

    def _to_spool(self, record: dict[str, Any]) -> None:
        assert self.spool is not None
        if record["op"] in ("artifact", "model"):
            record = self._copy_artifact(record)
        if record["op"] == "create_run":
            self.store.ids.setdefault(record["client_id"], record["client_id"])
        self.spool.append(record)
        self.spooled += 1

    def _copy_artifact(self, record: dict[str, Any]) -> dict[str, Any]:
        assert self.spool is not None
        name = uuid.uuid4().hex[:12]
        source, target = Path(record["path"]), self.spool.artifact_dir(name)
        if source.is_dir():
            shutil.copytree(source, target / source.name)
        else:
            target.mkdir(parents=True)
            shutil.copy2(source, target / source.name)
        return {**record, "path": f"artifacts/{name}/{source.name}"}

    def _drain(self) -> None:
        """Send the spool's records, oldest first, until it is empty or the server is away."""
        if self.spool is None:
            return
        if not answers(self.tracking_uri):  # asked briefly: a silent server holds no write
            self._retry_later()
            return
        sent, outage = drain(self, self.spool)
        if outage is not None:
            self._retry_later()
            return
        self._delay = self._backoff[0]
        if sent:
            log.warning(
                "MLflow tracking server %s answers again: %d spooled records sent",
                redact(self.tracking_uri),
                sent,
            )

    def _retry_later(self) -> None:
        """Try the server again after the current back-off, even when nothing else is written."""
        delay = self._delay
        self._delay = min(self._backoff[1], self._delay * 2)
        self._next_try = time.monotonic() + delay
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(delay, self._wake)
        self._timer.daemon = True
        self._timer.start()

    def _wake(self) -> None:
        if not self._closed:
            with contextlib.suppress(RuntimeError):  # shut down meanwhile
                self.submit(self._drain)


def drain(writer: MlflowWriter, spool: Spool) -> tuple[int, Exception | None]:
    """Send `spool`'s waiting records through `writer`, in order.

    A record the store refuses for another reason than an outage (a run deleted in the UI
    meanwhile) is kept aside in the spool's `rejected.jsonl` with the error, so the records
    behind it go on.

    Returns:
        How many records were sent, and the outage that stopped it (None: all sent).
    """
    writer.store.ids.update(spool.ids)
    sent = 0
    for record in spool.pending():
        try:
            writer.store.send(record, spool)
        except Exception as exc:
            if is_outage(exc):
                return sent, exc
            log.warning("MLflow refused a spooled %s record: %s", record["op"], first_line(exc))
            spool.reject(record, first_line(exc))
        spool.mark_sent()
        sent += 1
    return sent, None


def run_id_now(run: Run, *, wait_seconds: float = 1.0) -> str:
    """The run's id, waiting `wait_seconds` at most for the writer to create it.

    A writer held up by a server that does not answer gives the run's client-side id
    instead (tag `hpo.client_run_id` on the run; the writer's records for it reach it), so
    a caller never waits for the server.
    """
    if isinstance(run, str):
        return run
    with contextlib.suppress(TimeoutError):
        return run.result(timeout=wait_seconds)
    ref = getattr(run, _CLIENT_ID_ATTR, None)
    return str(ref) if ref else run.result()


_CLIENT_ID_ATTR = "hpo_client_id"


def _run_id(run: Run) -> str:
    # Runs created through `submit` were queued first, so on the writer's thread they are done.
    return run.result() if isinstance(run, Future) else run
