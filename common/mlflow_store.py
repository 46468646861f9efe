"""The records the MLflow writer sends, and the store calls that send them.

A record is a plain dict (`op` and its fields) so that it can wait in the on-disk spool
(`common.spool`) unchanged: `MlflowStore.send` turns one into calls of one `MlflowClient`,
splitting batches by MLflow's per-call limits, and keeps the map from client-side ids (runs
created while the server was away) to the store's ids. Param and tag values pass through
`redact` when a record is made, so a password inside a URL never reaches the store or the
spool.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.mlflow_seed import sqlite_path
from common.outage import is_http, is_outage
from common.redact import redact
from common.retry import lost_schema_race, retry_schema_race
from common.spool import Spool

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Run

log = logging.getLogger(__name__)

# MLflow's limits for one log_batch call, and for one value.
MAX_METRICS_PER_CALL = 1000
MAX_PARAMS_PER_CALL = 100
MAX_TAGS_PER_CALL = 100
MAX_PARAM_LENGTH = 6000
MAX_TAG_LENGTH = 5000
# Runs created through the spool carry their client-side id, so a retry finds them.
CLIENT_ID_TAG = "hpo.client_run_id"
CLIENT_ID_PREFIX = "hpo-"
_URI_ENV = "MLFLOW_TRACKING_URI"  # what `mlflow.set_tracking_uri` also sets


def metric(key: str, value: float, step: int) -> Metric:
    """One value of metric `key` at `step`, stamped now."""
    from mlflow.entities import Metric

    return Metric(key, float(value), int(time.time() * 1000), step)


def batch_record(
    metrics: Iterable[Metric] = (),
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Metrics, params and tags for one run, as the writer sends or spools them."""
    return {
        "op": "log_batch",
        "metrics": [[m.key, m.value, m.timestamp, m.step] for m in metrics],
        "params": {k: _param_value(v) for k, v in (params or {}).items()},
        "tags": tag_values(tags or {}),
    }


def stored_run(client: MlflowClient, run_id: str) -> Run | None:
    """Run `run_id`, or None when this store does not hold it.

    Raises:
        Exception: MLflow's, when the server did not answer: that says nothing about the run,
            and reading it as "no such run" would start a second one.
    """
    try:
        return client.get_run(run_id)
    except Exception as exc:
        if is_outage(exc):
            raise
        return None


def tag_values(tags: Mapping[str, Any]) -> dict[str, str]:
    """Tag values as MLflow takes them: text, redacted, cut at its length limit."""
    return {k: redact(str(v))[:MAX_TAG_LENGTH] for k, v in tags.items()}


def client_id(kind: str) -> str:
    """A new client-side id for an experiment or run the store has not created yet."""
    return f"{CLIENT_ID_PREFIX}{kind}-{uuid.uuid4().hex}"


def now_ms() -> int:
    return int(time.time() * 1000)


def first_line(exc: Exception) -> str:
    """The error's first line, redacted (its type's name when it says nothing)."""
    text = str(exc).strip()
    return redact(text.splitlines()[0]) if text else type(exc).__name__


def _param_value(value: Any) -> str:
    text = f"{value:.6g}" if isinstance(value, float) else str(value)
    return redact(text)[:MAX_PARAM_LENGTH]


@contextlib.contextmanager
def process_tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's process-global tracking URI set to `uri` for a while, then put back as it was.

    `mlflow.get_tracking_uri()` reads an unset URI as the default store, so setting back what
    it returned left a URI set for the rest of the process (a user's own code, or
    transformers' `MLflowCallback`, which keeps a URI it finds set over its
    MLFLOW_TRACKING_URI). `set_tracking_uri` also writes that variable: it is put back too.
    """
    import mlflow
    from mlflow.tracking._tracking_service import utils

    held_uri, held_env = utils._tracking_uri, os.environ.get(_URI_ENV)
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(held_uri)  # type: ignore[arg-type]  # None: unset, as it was
        if held_env is None:
            os.environ.pop(_URI_ENV, None)
        else:
            os.environ[_URI_ENV] = held_env


class MlflowStore:
    """One `MlflowClient` and the records sent through it.

    Args:
        client: The client of the tracking store.
        tracking_uri: Its URI (the model registry resolves `models:/` through it).
    """

    def __init__(self, client: MlflowClient, tracking_uri: str) -> None:
        self.client = client
        self.tracking_uri = tracking_uri
        self.ids: dict[str, str] = {}  # client-side ids -> the store's ids

    def resolve(self, ref: str) -> str:
        """The store's id for `ref` once known (a client-side id until then)."""
        return self.ids.get(ref, ref)

    def experiment(self, name: str, artifact_dir: str | None) -> str:
        """The id of experiment `name`, created (with its artifact folder) when missing."""
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return str(experiment.experiment_id)
        location = None
        store_file = sqlite_path(self.tracking_uri)
        if not artifact_dir and store_file is not None:
            # MLflow's default (./mlruns) is the folder the command was typed in: a run's
            # adapter would land wherever the user stood. Beside the store instead, where a
            # study's work dir keeps them (`common.workdir.WorkDir.artifacts`).
            artifact_dir = str(store_file.parent / "mlartifacts")
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

    def send(self, record: dict[str, Any], spool: Spool | None = None) -> None:
        """One record into the store; from `spool`, a run creation looks for its run first."""
        op = record["op"]
        if op == "experiment":
            found = self.experiment(record["name"], record.get("dir"))
            self.map_id(record["client_id"], found, spool)
        elif op == "create_run":
            self._create_run(record, spool)
        elif op == "log_batch":
            self._log_batch(record)
        elif op == "terminate":
            self.client.set_terminated(
                self.resolve(record["run"]), status=record["status"], end_time=record["end_time"]
            )
        elif op == "status":
            self.client.update_run(self.resolve(record["run"]), status=record["status"])
        elif op == "input":
            self._log_input(record)
        elif op == "model":
            self._log_model(record, _local(record["path"], spool))
        elif op == "artifact":
            path, run_id = _local(record["path"], spool), self.resolve(record["run"])
            if path.is_dir():
                self.client.log_artifacts(run_id, str(path), artifact_path=record["artifact_path"])
            else:
                self.client.log_artifact(run_id, str(path), artifact_path=record["artifact_path"])
        else:
            raise ValueError(f"unknown MLflow record, but got op={op!r}")

    def map_id(self, client_side: str, run_id: str, spool: Spool | None) -> None:
        """Remember the store's id, on disk too when the record came from a spool."""
        self.ids[client_side] = run_id
        if spool is not None:
            spool.map_id(client_side, run_id)

    def _log_input(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Dataset, DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        tags = [InputTag(MLFLOW_DATASET_CONTEXT, record["context"])]
        inputs = [DatasetInput(Dataset(**record["dataset"]), tags=tags)]
        run_id = self.resolve(record["run"])
        # Workers logging one dataset at once both insert it; the loser finds it on a retry.
        retry_schema_race(lambda: self.client.log_inputs(run_id, datasets=inputs))

    def _log_model(self, record: dict[str, Any], path: Path) -> None:
        """Create the LoggedModel, upload the folder, link it to the run; register it if asked."""
        from mlflow.entities import LoggedModelOutput

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
        with process_tracking_uri(self.tracking_uri):
            self.client.create_model_version(
                name,
                source=f"models:/{model.model_id}",
                run_id=run_id,
                tags=record["tags"],
                model_id=model.model_id,
                await_creation_for=0,  # the writer does not wait for a registry's copy
            )

    def _create_run(self, record: dict[str, Any], spool: Spool | None) -> None:
        client_side = record["client_id"]
        experiment_id = self.resolve(record["experiment_id"])
        if spool is not None:
            # Sent before, its reply lost with the server? Then the run is there already.
            found = self._find_run(experiment_id, f"tags.`{CLIENT_ID_TAG}` = '{client_side}'")
            if found is None and record.get("adopt"):
                found = self._find_run(experiment_id, record["adopt"])
            if found is not None:
                self.map_id(client_side, found, spool)
                return
        run = self.client.create_run(
            experiment_id,
            run_name=record["run_name"],
            # A parent run that waited in the spool too is named by the id it has now.
            tags={
                **{k: self.resolve(v) for k, v in record["tags"].items()},
                CLIENT_ID_TAG: client_side,
            },
            start_time=record["start_time"],
        )
        self.map_id(client_side, str(run.info.run_id), spool)

    def _find_run(self, experiment_id: str, filter_string: str) -> str | None:
        from mlflow.entities import ViewType

        runs = self.client.search_runs(
            [experiment_id], filter_string=filter_string, run_view_type=ViewType.ACTIVE_ONLY
        )
        if not runs:
            return None
        return str(min(runs, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id)

    def _log_batch(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        run_id = self.resolve(record["run"])
        metric_list = [Metric(k, v, t, s) for k, v, t, s in record["metrics"]]
        param_list = [Param(k, v) for k, v in record["params"].items()]
        tag_list = [RunTag(k, v) for k, v in record["tags"].items()]
        while metric_list or param_list or tag_list:
            self._log_chunk(
                run_id,
                metric_list[:MAX_METRICS_PER_CALL],
                param_list[:MAX_PARAMS_PER_CALL],
                tag_list[:MAX_TAGS_PER_CALL],
            )
            metric_list = metric_list[MAX_METRICS_PER_CALL:]
            param_list = param_list[MAX_PARAMS_PER_CALL:]
            tag_list = tag_list[MAX_TAGS_PER_CALL:]

    def _log_chunk(
        self, run_id: str, metrics: list[Any], params: list[Any], tags: list[Any]
    ) -> None:
        """One `log_batch` call. A param another writer logged first keeps its value: MLflow
        refuses to change one (the whole call), and workers of one study share its parent
        run, where two first sessions that start together each log their own search plan.
        When both insert at the same moment, MLflow's check sees neither and the database's
        key refuses the second (PostgreSQL: duplicate key on `param_pk`). Either way the call
        is made again without the params the run holds by then, and says which differed."""
        from mlflow.exceptions import MlflowException

        for attempt in range(PARAM_CLASH_ATTEMPTS):
            try:
                self.client.log_batch(run_id, metrics=metrics, params=params, tags=tags)
                return
            except MlflowException as exc:
                if not params or not _param_clash(exc) or attempt == PARAM_CLASH_ATTEMPTS - 1:
                    raise
            # The refused call wrote nothing (params go first, in one transaction), and the
            # other writer's params are committed: its insert is what refused ours.
            held = self.client.get_run(run_id).data.params
            changed = sorted(p.key for p in params if p.key in held and held[p.key] != p.value)
            if changed:
                log.warning(
                    "run %s already holds params %s with other values (logged first by another "
                    "writer); those keep their first values",
                    run_id, ", ".join(changed),
                )  # fmt: skip
            params = [p for p in params if p.key not in held]


# What MLflow's stores (file, SQL, and the server relaying them) say when a param would change.
_PARAM_CHANGE = "Changing param values is not allowed"
# A third writer could win the next insert too; past that the failure is not a race.
PARAM_CLASH_ATTEMPTS = 3


def _param_clash(exc: BaseException) -> bool:
    """Whether MLflow refused a batch because the run holds one of its params already: a
    changed value (MLflow's own check), or two inserts of one key at once (the database's:
    PostgreSQL names the `param_pk` key, SQLite the `params` table, MySQL its PRIMARY key)."""
    text = str(exc)
    if _PARAM_CHANGE in text:
        return True
    return lost_schema_race(exc) and ("param_pk" in text or "params." in text)


def _local(path: str, spool: Spool | None) -> Path:
    """A record's file: a relative path is a copy kept in the spool it came from."""
    local = Path(path)
    if spool is not None and not local.is_absolute():
        return spool.folder / local
    return local
