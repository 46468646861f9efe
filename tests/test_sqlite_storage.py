"""The SQLite storage runs in write-ahead mode and keeps what a killed worker committed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
from sqlalchemy import text

from hpo.storage import make_storage


def test_sqlite_storage_is_write_ahead_with_normal_sync(tmp_path: Path) -> None:
    storage = make_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    with storage.engine.connect() as connection:  # type: ignore[attr-defined]
        mode = connection.execute(text("PRAGMA journal_mode")).scalar()
        sync = connection.execute(text("PRAGMA synchronous")).scalar()
    assert mode == "wal"
    assert sync == 1  # NORMAL (the default FULL is 2)


def test_a_killed_worker_loses_nothing_it_committed(tmp_path: Path) -> None:
    """A process that dies without closing (os._exit: no checkpoint, the -wal file left
    behind) leaves its committed trials readable by the next process."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    child = textwrap.dedent(
        f"""
        import os, optuna
        from hpo.storage import make_storage
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(storage=make_storage({url!r}), study_name="s")
        for i in range(3):
            trial = study.ask()
            trial.suggest_float("x", 0.0, 1.0)
            trial.set_user_attr("i", i)
            study.tell(trial, float(i))
        study.ask()  # left running when the worker dies
        os._exit(0)
        """
    )
    done = subprocess.run([sys.executable, "-c", child], cwd=Path(__file__).parent.parent)
    assert done.returncode == 0
    assert (tmp_path / "optuna.db-wal").exists()  # not checkpointed: the commits live there
    study = optuna.load_study(study_name="s", storage=make_storage(url))
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 3
    assert states.count(optuna.trial.TrialState.RUNNING) == 1
    assert sorted(t.user_attrs["i"] for t in study.trials if t.user_attrs) == [0, 1, 2]
    assert sorted(t.value for t in study.trials if t.value is not None) == [0.0, 1.0, 2.0]
