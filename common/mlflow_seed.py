"""A new SQLite MLflow store copied from an empty one MLflow created before.

MLflow creates a store's tables by running its ~100 schema migrations (alembic), about 2 s
on a quiet 2-vCPU VM and 8 s under load: every study in a new work dir paid it before its
first trial. The first store a version of MLflow creates here is kept (a consistent copy,
made before anything is written to it) under ``<cache root>/mlflow``; later new stores start
as a copy of it, their default experiment's artifact location and times set as MLflow would
set them. A store that exists is never touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)


def sqlite_path(tracking_uri: str) -> Path | None:
    """The file of a ``sqlite:///`` tracking URI, else None."""
    if not tracking_uri.startswith("sqlite:///") or "?" in tracking_uri:
        return None  # a URI with options is left to MLflow
    return Path(tracking_uri.removeprefix("sqlite:///"))


def template_path() -> Path:
    """The empty store of this MLflow version (``$HPO_CACHE_DIR`` or ``~/.cache/hpo``)."""
    import mlflow

    env = os.environ.get("HPO_CACHE_DIR")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "hpo"
    return root / "mlflow" / f"empty-store-{mlflow.__version__}.db"


def seed(path: Path) -> bool:
    """Create the store `path` as a copy of the empty one, if there is one; True if copied.

    The copy is made beside `path` and linked into place only where no file is: a store
    another process created meanwhile is kept.
    """
    template = template_path()
    if path.exists() or not template.is_file():
        return False
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex}.seed")
    try:
        with (
            contextlib.closing(sqlite3.connect(template)) as source,
            contextlib.closing(sqlite3.connect(staging)) as target,
        ):
            source.backup(target)
            now = int(time.time() * 1000)
            # What MLflow writes for its default experiment: ./mlruns/0 where it starts.
            target.execute(
                "UPDATE experiments SET artifact_location = ?, creation_time = ?, "
                "last_update_time = ? WHERE experiment_id = 0",
                (str(Path.cwd() / "mlruns" / "0"), now, now),
            )
            target.commit()
        os.link(staging, path)
    except (OSError, sqlite3.Error) as exc:
        log.debug("new MLflow store not seeded (%s): MLflow creates it", exc)
        return False
    finally:
        staging.unlink(missing_ok=True)
    return True


def keep(path: Path) -> None:
    """Keep the store MLflow just created at `path` as the empty one (once per version)."""
    template = template_path()
    if template.is_file():
        return
    staging = template.with_name(f".{template.name}.{uuid.uuid4().hex}")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        with (
            contextlib.closing(sqlite3.connect(path)) as source,
            contextlib.closing(sqlite3.connect(staging)) as target,
        ):
            source.backup(target)
            runs = target.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
            experiments = target.execute("SELECT COUNT(*) FROM experiments").fetchone()[0]
        if runs == 0 and experiments == 1:  # nothing but MLflow's own default experiment
            os.replace(staging, template)
    except (OSError, sqlite3.Error) as exc:
        log.debug("empty MLflow store not kept (%s)", exc)
    finally:
        staging.unlink(missing_ok=True)
