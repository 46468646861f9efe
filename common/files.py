"""Files that must survive a crash, their digests, and YAML read one way.

Every file the project writes for a later reader (presets, calibration, JSON results, token
caches, run ids) goes through `write_atomic`: written to a temporary file in the same
folder, flushed and fsynced, then renamed into place, so a reader sees the old content or
the new, never half of it. Folders (checkpoints, reports, built models) are written whole
into a staging folder beside their place and swapped in by `replace_folder`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import yaml

from common.errors import BadInputError


def write_atomic(path: str | Path, content: str | Callable[[IO[bytes]], None]) -> Path:
    """Write `content` (text, or a function that writes bytes to a stream) atomically.

    A path that is not a regular file (`/dev/null`, `/dev/stdout`, a named pipe) is written
    in place: renaming onto it would replace the device with a file, for every process.

    Returns:
        The path written.
    """
    target = Path(path)
    if target.exists() and not target.is_file() and not target.is_dir():
        with open(target, "wb") as stream:
            if isinstance(content, str):
                stream.write(content.encode("utf-8"))
            else:
                content(stream)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            if isinstance(content, str):
                handle.write(content.encode("utf-8"))
            else:
                content(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def replace_folder(staging: Path, target: Path, *, aside: Path | None = None) -> Path:
    """Rename the fully written folder `staging` to `target`, in place of any folder there.

    An existing `target` is first renamed aside, then removed once the new one is in place,
    so its name never holds half of either. Both folders must be on one file system (a
    staging folder is made beside its target).

    Args:
        staging: The new folder's content.
        target: Its place.
        aside: Where the old folder waits until it is removed; default a hidden sibling.

    Returns:
        `target`.
    """
    old = None
    if target.exists():
        old = aside or target.with_name(f".{target.name}-old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        target.rename(old)
    staging.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def write_json(path: str | Path, payload: Any, *, indent: int = 2) -> Path:
    return write_atomic(path, json.dumps(payload, indent=indent, default=str) + "\n")


def sha256_file(path: str | Path, *, sync: bool = False) -> str:
    """sha256 hex digest of a file's bytes; `sync` also flushes it to disk first."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
        if sync:
            os.fsync(handle.fileno())
    return digest.hexdigest()


def read_yaml(path: str | Path, *, mapping: bool = True) -> Any:
    """Read YAML with `yaml.safe_load`; I/O and syntax errors become one-line BadInputErrors.

    Args:
        path: The file.
        mapping: Require a mapping at the top level (an empty file reads as `{}`).
    """
    file = Path(path)
    if file.is_dir():
        raise BadInputError(f"{path}: is a directory, not a YAML file")
    try:
        loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInputError(f"file not found: {path}") from None
    except OSError as error:
        raise BadInputError(f"{path}: cannot read: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise BadInputError(f"{path}: not valid YAML: {' '.join(str(error).split())}") from None
    if not mapping:
        return loaded
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise BadInputError(f"{path}: expected a mapping at the top level")
    return loaded
