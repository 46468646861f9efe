"""A trial's user attributes (and constraints) written in one transaction where the storage
allows it.

Optuna has no batch write for user attributes: each `Trial.set_user_attr` is a transaction
of its own (on SQLite a commit and its sync: 16 ms each on the loaded 2-vCPU VM, and a trial
wrote about thirty), and each `Trial.set_constraint` reads the trial back before its write.
On an RDB storage (SQLite, PostgreSQL, MySQL) `set_user_attrs` writes them in one
transaction, one multi-row upsert per table; on
others (the journal file, in memory) one by one as before. The keys and values are the same
either way (a constraint is the system attribute `Trial.set_constraint` writes), so every
reader of `trial.user_attrs` and of the constraints (the report, the export, the summary,
the samplers, workers, a resumed study) reads them as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import optuna


def set_user_attrs(
    trial: optuna.Trial,
    values: Mapping[str, Any],
    *,
    constraints: Mapping[str, float] | None = None,
) -> None:
    """Set `values` as `trial`'s user attributes: one transaction on an RDB storage.

    Args:
        trial: The running trial.
        values: User attributes (JSON-serializable values).
        constraints: Constraint values by name, as `Trial.set_constraint(name, value)` sets
            them (feasible when all are <= 0); each is set once per trial.

    Raises:
        ValueError: A constraint value is NaN (as `Trial.set_constraint`).
    """
    system = _constraint_attrs(constraints or {})
    if not values and not system:
        return
    backend = _rdb_backend(trial)
    try:  # Optuna's private modules: a version that moved them writes one by one.
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session
    except ImportError:
        backend = None
    if backend is None:
        for key, value in values.items():
            trial.set_user_attr(key, value)
        for name, value in (constraints or {}).items():
            trial.set_constraint(name, value)
        return

    trial_id = trial._trial_id
    with _create_scoped_session(backend.scoped_session, True) as session:
        upsert = _upsert_many(backend, session, trial_id)
        for model_cls, attrs in (
            (models.TrialUserAttributeModel, values),
            (models.TrialSystemAttributeModel, system),
        ):
            if upsert is not None and attrs:
                upsert(model_cls, attrs)
                continue
            for key, value in attrs.items():
                backend._set_trial_attr_without_commit(session, model_cls, trial_id, key, value)
    # What `Trial.set_user_attr` / `set_constraint` do after their write: the trial's own
    # view sees them.
    trial._cached_frozen_trial.user_attrs.update(values)
    trial._cached_frozen_trial.system_attrs.update(system)


def _upsert_many(backend: Any, session: Any, trial_id: int) -> Any:
    """A writer of many attributes of one table in one statement, or None.

    What Optuna's `_set_trial_attr_without_commit` does per key (find the trial, check it
    is still running, upsert `value_json`), with the trial found once and every key in one
    multi-row upsert: Optuna's own per-key path looked the trial up again for each key,
    about 1 ms a key (a trial writes about thirty). SQLite, PostgreSQL and MySQL (the
    dialects Optuna upserts on); None for another dialect (then one key at a time).
    """
    import json
    import sqlite3

    from optuna.storages._rdb import models

    name = backend.engine.name
    if name == "sqlite" and sqlite3.sqlite_version_info >= (3, 24, 0):
        from sqlalchemy.dialects.sqlite import insert
    elif name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert  # type: ignore[assignment]
    elif name == "mysql":
        from sqlalchemy.dialects.mysql import insert  # type: ignore[assignment]
    else:
        return None
    trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
    backend.check_trial_is_updatable(trial_id, trial.state)

    def upsert(model_cls: Any, attrs: Mapping[str, Any]) -> None:
        rows = [
            {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
            for key, value in attrs.items()
        ]
        statement: Any = insert(model_cls).values(rows)
        if name == "mysql":
            statement = statement.on_duplicate_key_update(value_json=statement.inserted.value_json)
        else:
            statement = statement.on_conflict_do_update(
                index_elements=[model_cls.trial_id, model_cls.key],
                set_={"value_json": statement.excluded.value_json},
            )
        session.execute(statement)

    return upsert


def _constraint_attrs(constraints: Mapping[str, float]) -> dict[str, float]:
    """The system attributes `Trial.set_constraint` writes for `constraints`."""
    from optuna.study._constrained_optimization import _CONSTRAINTS_KEY

    out = {}
    for name, value in constraints.items():
        number = float(value)
        if math.isnan(number):
            raise ValueError(f"constraint {name!r} is NaN, but got {value=}")
        out[f"{_CONSTRAINTS_KEY}:{name}"] = number
    return out


def _rdb_backend(trial: optuna.Trial) -> Any:
    """The RDB storage under `trial`'s (cached) storage whose private per-session write
    `set_user_attrs` uses; None where there is none (or Optuna changed it)."""
    from optuna.storages import RDBStorage

    storage = getattr(trial, "storage", None)
    backend = getattr(storage, "_backend", storage)
    needed = ("scoped_session", "_set_trial_attr_without_commit")
    if not isinstance(backend, RDBStorage) or not all(hasattr(backend, n) for n in needed):
        return None
    if not hasattr(trial, "_trial_id") or not hasattr(trial, "_cached_frozen_trial"):
        return None
    return backend
