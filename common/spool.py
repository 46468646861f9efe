"""An on-disk, in-order queue of MLflow records waiting for their tracking server.

When the server does not answer, the project's MLflow writer appends each record (create a
run, log a batch, close a run, upload an artifact) here instead of losing it, and sends
them in order once the server answers again; `python -m hpo.tracking --replay DIR` sends a
spool left behind by a process that ended first.

One folder per writer process:

    records.jsonl   one JSON record a line, appended and fsynced
    sent            how many records from the top are in the store (written atomically)
    ids.json        run ids made up while offline -> the ids the server gave them
    meta.json       tracking URI (password hidden), host, process id, start time
    artifacts/      copies of files to upload, named by the records that upload them
    lock            held (flock) while a process writes or sends this spool
    rejected.jsonl  records the store refused for another reason than an outage, with why

Records are redacted before they are spooled (the writer redacts params and tags): nothing
secret is written here.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from common.files import write_atomic
from common.redact import redact

RECORDS = "records.jsonl"
SENT = "sent"
IDS = "ids.json"
META = "meta.json"
LOCK = "lock"
REJECTED = "rejected.jsonl"


class SpoolBusy(Exception):
    """Another live process holds this spool."""


class Spool:
    """One spool folder, locked by this process while it is open.

    Args:
        folder: The spool's folder (created when missing).
        tracking_uri: Recorded (password hidden) for a later replay; None keeps what is there.

    Raises:
        SpoolBusy: Another live process holds the folder.
    """

    def __init__(self, folder: Path, *, tracking_uri: str | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock: IO[bytes] | None = (self.folder / LOCK).open("ab")
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise SpoolBusy(f"spool {self.folder} is in use by another process") from None
        if tracking_uri is not None or not (self.folder / META).exists():
            meta = {
                "tracking_uri": redact(tracking_uri or ""),
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started": time.time(),
            }
            write_atomic(self.folder / META, json.dumps(meta) + "\n")
        _drop_cut_line(self.folder / RECORDS)
        self.sent = _read_int(self.folder / SENT)
        self.ids: dict[str, str] = _read_json(self.folder / IDS)
        self.total = sum(1 for _ in self._lines())

    @classmethod
    def new(cls, root: Path, tracking_uri: str) -> Spool:
        """A fresh spool folder under `root`, named after this host and process."""
        name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        return cls(Path(root) / name, tracking_uri=tracking_uri)

    @staticmethod
    def meta(folder: Path) -> dict[str, Any]:
        """What a spool folder recorded about itself (read without taking its lock)."""
        return _read_json(Path(folder) / META)

    @property
    def waiting(self) -> int:
        """Records not yet in the store."""
        return self.total - self.sent

    @property
    def tracking_uri(self) -> str:
        """The URI these records were meant for (password hidden)."""
        return str(_read_json(self.folder / META).get("tracking_uri") or "")

    def append(self, record: dict[str, Any]) -> None:
        """Add `record` at the end, on disk before this returns."""
        with (self.folder / RECORDS).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.total += 1

    def pending(self) -> Iterator[dict[str, Any]]:
        """The records not yet sent, oldest first."""
        for index, line in enumerate(self._lines()):
            if index >= self.sent:
                yield json.loads(line)

    def mark_sent(self, count: int = 1) -> None:
        """`count` more records from the top are in the store."""
        self.sent += count
        write_atomic(self.folder / SENT, f"{self.sent}\n")

    def reject(self, record: dict[str, Any], error: str) -> None:
        """Keep a record the store refused (not an outage) aside, with the reason."""
        with (self.folder / REJECTED).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({**record, "error": error}) + "\n")

    def map_id(self, client_id: str, run_id: str) -> None:
        """Remember the server's id of a run created from the spool."""
        self.ids[client_id] = run_id
        write_atomic(self.folder / IDS, json.dumps(self.ids) + "\n")

    def artifact_dir(self, name: str) -> Path:
        """A folder inside the spool for the files of one upload record."""
        return self.folder / "artifacts" / name

    def close(self, *, remove_if_done: bool = True) -> None:
        """Release the lock; a spool with nothing waiting (and nothing refused) is removed."""
        if self._lock is None:
            return
        # Records the store refused stay for a reader to see (rejected.jsonl).
        if remove_if_done and self.waiting == 0 and not (self.folder / REJECTED).exists():
            _remove_tree(self.folder)
        fcntl.flock(self._lock.fileno(), fcntl.LOCK_UN)
        self._lock.close()
        self._lock = None

    def _lines(self) -> Iterator[str]:
        path = self.folder / RECORDS
        if not path.exists():
            return
        with path.open(encoding="utf-8") as handle:
            yield from handle


def spool_folders(root: Path) -> list[Path]:
    """The spool folders in `root`, or `root` itself when it is one; oldest first."""
    root = Path(root)
    if (root / META).exists() or (root / RECORDS).exists():
        return [root]
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if (p / META).exists() or (p / RECORDS).exists()]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def _drop_cut_line(path: Path) -> None:
    """A process that died mid-append left half a line: that record was never spooled."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text(encoding="utf-8").strip() or 0)
    except FileNotFoundError:
        return 0


def _read_json(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _remove_tree(folder: Path) -> None:
    import shutil

    for child in folder.iterdir():
        if child.name != LOCK:
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
    (folder / LOCK).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass
