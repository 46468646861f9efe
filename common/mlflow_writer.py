"""The project's one MLflow writer: ordered, batched, in the background, with secrets redacted.

Used by the study (a parent run, one nested run per trial) and by a full training run. Writes
(`log_batch`, `set_terminated`, anything given to `submit`) run in order on one background
thread, so a training loop only enqueues them; `flush()` waits for all of it and raises the
first failure. (MLflow's own asynchronous mode covers `log_batch` only; creating and closing
runs would still block, and its queue thread then competes with them for SQLite's write
lock.) Batches are split by MLflow's per-call limits here and nowhere else. Param and tag
values pass through `redact`, so a password inside a URL never reaches the store.

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
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from common.errors import BadInputError
from common.outage import answers
from common.redact import redact
from common.retry import retry_schema_race
from common.spool import Spool, SpoolBusy, spool_folders

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Metric

# MLflow's limits for one log_batch call, and for one value.
MAX_METRICS_PER_CALL = 1000
MAX_PARAMS_PER_CALL = 100
MAX_TAGS_PER_CALL = 100
MAX_PARAM_LENGTH = 6000
MAX_TAG_LENGTH = 5000
# Runs created through the spool carry their client-side id, so a retry finds them.
CLIENT_ID_TAG = "hpo.client_run_id"
CLIENT_ID_PREFIX = "hpo-"

log = logging.getLogger(__name__)

T = TypeVar("T")
RunRef: TypeAlias = Future[str]  # a run id that the background writer fills in
Run: TypeAlias = str | RunRef  # a run id, or one still being created in the background


def metric(key: str, value: float, step: int) -> Metric:
    """One value of metric `key` at `step`, stamped now."""
    from mlflow.entities import Metric

    return Metric(key, float(value), int(time.time() * 1000), step)


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
            _fail_fast_http()
        self.spool_root = Path(spool_root) if spool_root is not None else None
        self.spool: Spool | None = None  # opened on the first write the server does not take
        self.spooled = 0  # records that waited in the spool, in this process
        self._ids: dict[str, str] = {}  # client-side ids -> the store's ids
        self._backoff = backoff
        self._delay = backoff[0]
        self._next_try = 0.0
        self._timer: threading.Timer | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-writer")
        self._pending: list[Future[Any]] = []
        # The store creates (and migrates) its tables on first contact.
        self.client: MlflowClient = self.setup(lambda: MlflowClient(tracking_uri=tracking_uri))

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
                    f"({_outage_reason(exc)})"
                ) from None
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
        return self.setup(lambda: self._experiment_now(name, artifact_dir))

    def experiment_later(self, name: str, *, artifact_dir: str | None = None) -> str:
        """A client-side id for experiment `name`, found or created once the server answers.

        For a start while the server is away: runs created with this id go into it.
        """
        client_id = _client_id("exp")
        record = {"op": "experiment", "client_id": client_id, "name": name, "dir": artifact_dir}
        self.submit(self._handle, record).result()
        return self._ids.get(client_id, client_id)

    def _experiment_now(self, name: str, artifact_dir: str | None) -> str:
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return str(experiment.experiment_id)
        location = None
        if artifact_dir and not is_http(self.tracking_uri):
            location = Path(artifact_dir).resolve().as_uri()
        return str(
            self.client.create_experiment(
                name,
                artifact_location=location,
                # Tells the UI this is model development, so it opens on the runs table.
                tags={"mlflow.experimentKind": "finetuning"},
            )
        )

    def create_run(self, experiment_id: str, *, run_name: str, tags: Mapping[str, Any]) -> str:
        """Create a run now and return its id (`create_run_later` queues it instead)."""
        run = self.client.create_run(
            self.resolve(experiment_id),
            run_name=run_name,
            tags={k: _tag_value(v) for k, v in tags.items()},
        )
        return str(run.info.run_id)

    def create_run_later(
        self,
        experiment_id: str,
        *,
        run_name: str,
        tags: Mapping[str, Any],
        adopt: str | None = None,
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
        client_id = _client_id("run")
        record = {
            "op": "create_run",
            "client_id": client_id,
            "experiment_id": experiment_id,
            "run_name": run_name,
            "tags": {k: _tag_value(v) for k, v in tags.items()},
            "start_time": _now_ms(),
            "adopt": adopt,
        }
        created = self.submit(self._create_and_resolve, record)
        setattr(created, _CLIENT_ID_ATTR, client_id)  # for `run_id_now`
        if not self.waiting:
            return created
        # While records wait in the spool this one waits too: its client-side id is known now,
        # and a caller that needs the id does not wait behind the writer's tries.
        now: RunRef = Future()
        now.set_result(client_id)
        return now

    def resolve(self, ref: str) -> str:
        """The store's id for `ref` once known (a client-side id until then)."""
        return self._ids.get(ref, ref)

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
        self.submit(self.write_batch, run, list(metrics), dict(params or {}), dict(tags or {}))

    def write_batch(
        self,
        run: Run,
        metrics: Iterable[Metric] = (),
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        """Send now, or spool (call it on the writer's thread: `log_batch` queues it there)."""
        self._handle(
            {
                "op": "log_batch",
                "run": self.resolve(_run_id(run)),
                "metrics": [[m.key, m.value, m.timestamp, m.step] for m in metrics],
                "params": {k: _param_value(v) for k, v in (params or {}).items()},
                "tags": {k: _tag_value(v) for k, v in (tags or {}).items()},
            }
        )

    def set_terminated(self, run: Run, status: str) -> None:
        """Queue closing the run with MLflow `status` (FINISHED, KILLED, FAILED), stamped now."""
        end_time = _now_ms()
        self.submit(
            lambda: self._handle(
                {
                    "op": "terminate",
                    "run": self.resolve(_run_id(run)),
                    "status": status,
                    "end_time": end_time,
                }
            )
        )

    def update_run(self, run: Run, status: str) -> None:
        """Queue setting the run's status (RUNNING to reopen it)."""
        self.submit(
            lambda: self._handle(
                {"op": "status", "run": self.resolve(_run_id(run)), "status": status}
            )
        )

    def log_artifact(self, run_id: Run, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file, or a folder's files, after everything queued before it, and wait.

        Spooled, a copy of them waits in the spool (the caller may delete the originals).
        """
        record = {
            "op": "artifact",
            "path": str(Path(path).resolve()),
            "artifact_path": artifact_path,
        }
        self.submit(lambda: self._handle({**record, "run": self.resolve(_run_id(run_id))}))
        self.flush()

    def log_input(self, run: Run, dataset: Mapping[str, str], context: str = "training") -> None:
        """Queue an MLflow dataset input (`mlflow.entities.Dataset` fields as strings) on a run."""
        record = {"op": "input", "dataset": dict(dataset), "context": context}
        self.submit(lambda: self._handle({**record, "run": self.resolve(_run_id(run))}))

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
            "tags": {k: _tag_value(v) for k, v in tags.items()},
            "step": step,
            "register_as": register_as,
        }
        self.submit(lambda: self._handle({**record, "run": self.resolve(_run_id(run))}))
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
            self._send(record)
        except Exception as exc:
            if self.spool_root is None or not is_outage(exc):
                raise
            self._open_spool()
            log.warning(
                "MLflow tracking server %s does not answer (%s): records wait in %s and are "
                "sent when it answers again",
                redact(self.tracking_uri),
                _outage_reason(exc),
                self.spool_folder,
            )
            self._to_spool(record)
            self._retry_later()

    def _open_spool(self) -> None:
        if self.spool is None:
            assert self.spool_root is not None
            self.spool = Spool.new(self.spool_root, self.tracking_uri)

    def _to_spool(self, record: dict[str, Any]) -> None:
        assert self.spool is not None
        if record["op"] in ("artifact", "model"):
            record = self._copy_artifact(record)
        if record["op"] == "create_run":
            self._ids.setdefault(record["client_id"], record["client_id"])
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

    def _send(self, record: dict[str, Any], spool: Spool | None = None) -> None:
        """One record into the store; from `spool`, a run creation looks for its run first."""
        op = record["op"]
        if op == "experiment":
            found = self._experiment_now(record["name"], record.get("dir"))
            self._map(record["client_id"], found, spool)
        elif op == "create_run":
            self._send_create(record, spool)
        elif op == "log_batch":
            self._send_batch(record)
        elif op == "terminate":
            self.client.set_terminated(
                self.resolve(record["run"]), status=record["status"], end_time=record["end_time"]
            )
        elif op == "status":
            self.client.update_run(self.resolve(record["run"]), status=record["status"])
        elif op == "input":
            from mlflow.entities import Dataset, DatasetInput, InputTag
            from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

            tags = [InputTag(MLFLOW_DATASET_CONTEXT, record["context"])]
            inputs = [DatasetInput(Dataset(**record["dataset"]), tags=tags)]
            self.client.log_inputs(self.resolve(record["run"]), datasets=inputs)
        elif op == "model":
            self._send_model(record, spool)
        elif op == "artifact":
            path = Path(record["path"])
            if spool is not None and not path.is_absolute():
                path = spool.folder / path
            run_id = self.resolve(record["run"])
            if path.is_dir():
                self.client.log_artifacts(run_id, str(path), artifact_path=record["artifact_path"])
            else:
                self.client.log_artifact(run_id, str(path), artifact_path=record["artifact_path"])
        else:
            raise ValueError(f"unknown MLflow record, but got op={op!r}")

    def _send_model(self, record: dict[str, Any], spool: Spool | None) -> None:
        """Create the LoggedModel, upload the folder, link it to the run; register it if asked."""
        import mlflow
        from mlflow.entities import LoggedModelOutput

        path = Path(record["path"])
        if spool is not None and not path.is_absolute():
            path = spool.folder / path
        run_id = self.resolve(record["run"])
        experiment_id = self.client.get_run(run_id).info.experiment_id
        model = self.client.create_logged_model(
            experiment_id, name=record["name"], source_run_id=run_id, tags=record["tags"]
        )
        self.client.log_model_artifacts(model.model_id, str(path))
        self.client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=record["step"])])
        self.client.finalize_logged_model(model.model_id, "READY")
        name = record.get("register_as")
        if not name:
            return
        from mlflow.exceptions import MlflowException

        with contextlib.suppress(MlflowException):  # registered by an earlier run
            self.client.create_registered_model(name)
        # The registry resolves `models:/<id>` through the process's tracking URI.
        previous = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(self.tracking_uri)
        try:
            self.client.create_model_version(
                name,
                source=f"models:/{model.model_id}",
                run_id=run_id,
                tags=record["tags"],
                model_id=model.model_id,
                await_creation_for=0,  # the writer does not wait for a registry's copy
            )
        finally:
            mlflow.set_tracking_uri(previous)

    def _send_create(self, record: dict[str, Any], spool: Spool | None) -> None:
        client_id = record["client_id"]
        experiment_id = self.resolve(record["experiment_id"])
        if spool is not None:
            # Sent before, its reply lost with the server? Then the run is there already.
            found = self._find_run(experiment_id, f"tags.`{CLIENT_ID_TAG}` = '{client_id}'")
            if found is None and record.get("adopt"):
                found = self._find_run(experiment_id, record["adopt"])
            if found is not None:
                self._map(client_id, found, spool)
                return
        run = self.client.create_run(
            experiment_id,
            run_name=record["run_name"],
            # A parent run that waited in the spool too is named by the id it has now.
            tags={
                **{k: self.resolve(v) for k, v in record["tags"].items()},
                CLIENT_ID_TAG: client_id,
            },
            start_time=record["start_time"],
        )
        self._map(client_id, str(run.info.run_id), spool)

    def _find_run(self, experiment_id: str, filter_string: str) -> str | None:
        from mlflow.entities import ViewType

        runs = self.client.search_runs(
            [experiment_id], filter_string=filter_string, run_view_type=ViewType.ACTIVE_ONLY
        )
        if not runs:
            return None
        return str(min(runs, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id)

    def _send_batch(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        run_id = self.resolve(record["run"])
        metric_list = [Metric(k, v, t, s) for k, v, t, s in record["metrics"]]
        param_list = [Param(k, v) for k, v in record["params"].items()]
        tag_list = [RunTag(k, v) for k, v in record["tags"].items()]
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

    def _map(self, client_id: str, run_id: str, spool: Spool | None) -> None:
        """Remember the store's id, on disk too when the record came from a spool."""
        self._ids[client_id] = run_id
        if spool is not None:
            spool.map_id(client_id, run_id)


def drain(writer: MlflowWriter, spool: Spool) -> tuple[int, Exception | None]:
    """Send `spool`'s waiting records through `writer`, in order.

    A record the store refuses for another reason than an outage (a run deleted in the UI
    meanwhile) is kept aside in the spool's `rejected.jsonl` with the error, so the records
    behind it go on.

    Returns:
        How many records were sent, and the outage that stopped it (None: all sent).
    """
    writer._ids.update(spool.ids)
    sent = 0
    for record in spool.pending():
        try:
            writer._send(record, spool)
        except Exception as exc:
            if is_outage(exc):
                return sent, exc
            log.warning("MLflow refused a spooled %s record: %s", record["op"], _first_line(exc))
            spool.reject(record, _first_line(exc))
        spool.mark_sent()
        sent += 1
    return sent, None


def replay(folder: str | Path, tracking_uri: str | None = None) -> tuple[int, int]:
    """Send the records waiting in a spool folder (or in every spool folder under it).

    Args:
        folder: A spool folder, or the folder that holds them (a study's ``mlflow-spool``).
        tracking_uri: Where to send them; default: the URI the spool recorded.

    Returns:
        Records sent, and records still waiting (the server stopped answering again).

    Raises:
        BadInputError: No spool there; a URI that the spool does not hold (its password is
            hidden there: pass it); a server that does not answer.
    """
    folders = spool_folders(Path(folder))
    if not folders:
        raise BadInputError(f"{folder}: no MLflow spool here (records.jsonl or meta.json)")
    sent = waiting = 0
    for path in folders:
        try:
            spool = Spool(path)
        except SpoolBusy:
            log.warning("%s is being sent by a live process: left to it", path)
            continue
        try:
            uri = tracking_uri or spool.tracking_uri
            if not uri or "***" in uri:
                raise BadInputError(
                    f"{path}: the spool does not hold a usable tracking URI ({uri or 'none'}); "
                    "pass --tracking-uri"
                )
            writer = MlflowWriter(uri)
            done, outage = drain(writer, spool)
            sent += done
            if outage is not None:
                raise TrackingUnreachable(
                    f"MLflow tracking server {redact(uri)} does not answer "
                    f"({_outage_reason(outage)}); {spool.waiting} records still wait in {path}"
                )
            waiting += spool.waiting
        finally:
            spool.close()
    return sent, waiting


class TrackingUnreachable(BadInputError):
    """The tracking server does not answer (refused, timed out, or a gateway error)."""


def is_http(tracking_uri: str) -> bool:
    """Whether the store is an MLflow server reached over HTTP(S)."""
    return tracking_uri.startswith(("http://", "https://"))


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` says the tracking server did not answer, rather than refused a record.

    MLflow wraps the HTTP client's errors in its own exception: the cause chain and the
    message are read both.
    """
    import requests

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (requests.ConnectionError, requests.Timeout, ConnectionError)):
            return True
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    return any(marker in text for marker in _OUTAGE_MARKERS)


_OUTAGE_MARKERS = (
    "Max retries exceeded",
    "Connection refused",
    "Connection aborted",
    "Read timed out",
    "RemoteDisconnected",
    "error code 502",
    "error code 503",
    "error code 504",
)


def _outage_reason(exc: BaseException) -> str:
    text = str(exc)
    for reason in ("Connection refused", "Read timed out", "Connection aborted"):
        if reason in text:
            return reason.lower()
    for code in ("502", "503", "504"):
        if f"error code {code}" in text:
            return f"HTTP {code}"
    return "no answer"


def _fail_fast_http() -> None:
    """MLflow's HTTP client retries a refused connection for minutes by default.

    A writer that spools what the server does not take needs to know in seconds; a value
    the user set in the environment wins.
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


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
    client_id = getattr(run, _CLIENT_ID_ATTR, None)
    return str(client_id) if client_id else run.result()


_CLIENT_ID_ATTR = "hpo_client_id"


def _client_id(kind: str) -> str:
    return f"{CLIENT_ID_PREFIX}{kind}-{uuid.uuid4().hex}"


def _now_ms() -> int:
    return int(time.time() * 1000)


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
