"""Optuna storages by URL, with secrets kept out of every message."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import optuna

from common.errors import BadInputError
from common.redact import redact
from common.retry import retry_schema_race

log = logging.getLogger(__name__)


def make_storage(
    url: str, *, heartbeat_seconds: int = 30, grace_seconds: int = 120
) -> optuna.storages.BaseStorage:
    """Open the storage behind `url` and check it answers.

    SQLite (one worker), PostgreSQL/MySQL (many workers, with heartbeats: a worker silent
    for `grace_seconds` is taken as dead, its trial failed and queued again), or
    `journal:PATH` (a journal file).

    Raises:
        BadInputError: the URL is malformed or its server cannot be reached.
    """
    if url.startswith("journal:"):
        path = url.removeprefix("journal:").removeprefix("//")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(path))
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {}
    if not url.startswith("sqlite"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=2)
        kwargs = {
            "heartbeat_interval": heartbeat_seconds,
            "grace_period": grace_seconds,
            "heartbeat_stale_trial_callback": retry,
            "engine_kwargs": {"pool_pre_ping": True, "connect_args": _connect_args(url)},
        }
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # Workers started together on an empty database race to create the tables.
            storage = retry_schema_race(lambda: optuna.storages.RDBStorage(url, **kwargs))
    except Exception as exc:  # sqlalchemy raises many kinds; all mean "cannot use this URL"
        reason = redact(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__
        raise BadInputError(f"cannot open storage {redact(url)}: {reason}") from None
    if url.startswith("sqlite:///"):
        _write_ahead(storage.engine)
    return storage


def _write_ahead(engine: Any) -> None:
    """SQLite in write-ahead mode, synced at checkpoints: a commit costs half as much.

    A trial commits about 15 times (each suggested parameter, its attributes, its state):
    with the default rollback journal each commit syncs the file twice. In WAL mode with
    `synchronous=NORMAL` a process that dies loses nothing it committed (only a power cut
    can take the last commits back); readers no longer block the writer. The mode is kept in
    the file; `synchronous` is set on each new connection.
    """
    from sqlalchemy import event

    def on_connect(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        except Exception as exc:  # a read-only file keeps its mode; reading still works
            log.debug("SQLite storage left in its journal mode: %s", exc)
        finally:
            cursor.close()

    event.listen(engine, "connect", on_connect)
    engine.dispose()  # pooled connections opened before the listener reconnect with it


def _connect_args(url: str) -> dict[str, Any]:
    # Fail fast on an unreachable server instead of hanging for minutes.
    if url.startswith(("postgresql", "postgres")):
        return {"connect_timeout": 10}
    if url.startswith("mysql"):
        return {"connect_timeout": 10}
    return {}


def has_heartbeats(url: str) -> bool:
    """Server storages (PostgreSQL, MySQL) notice a dead worker by its missing heartbeat."""
    return not url.startswith(("sqlite", "journal:"))


def shared_by_processes(url: str) -> bool:
    """Several worker processes can share it: a server storage or a journal file.

    SQLite has no row locks: parallel workers fail with "database is locked".
    """
    return not url.startswith("sqlite")
