"""A trial's user attributes in one write (hpo.trial_attrs): the same keys and values as
Optuna's one-by-one writes, on every storage the study uses, read back by a new process."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from hpo.trial_attrs import _rdb_backend, set_user_attrs

VALUES = {"lora_r": 8, "steps_seconds": 1.5, "estimate": {"fits_window": True}, "tag": "x"}


@pytest.mark.parametrize("kind", ["sqlite", "journal", "memory"])
def test_the_attributes_are_those_of_one_by_one_writes(kind: str, tmp_path: Path) -> None:
    if kind == "sqlite":
        storage: str | optuna.storages.BaseStorage | None = f"sqlite:///{tmp_path / 'o.db'}"
    elif kind == "journal":
        from optuna.storages.journal import JournalFileBackend

        storage = optuna.storages.JournalStorage(JournalFileBackend(str(tmp_path / "j.log")))
    else:
        storage = None
    study = optuna.create_study(study_name="s", storage=storage)
    trial = study.ask()
    assert (_rdb_backend(trial) is not None) == (kind == "sqlite")  # one transaction there
    set_user_attrs(trial, VALUES)
    assert trial.user_attrs == VALUES  # the trial's own view, as set_user_attr leaves it
    study.tell(trial, 1.0)
    again = study if storage is None else optuna.load_study(study_name="s", storage=storage)
    assert again.trials[0].user_attrs == VALUES


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_constraints_are_those_of_set_constraint(kind: str, tmp_path: Path) -> None:
    """Constraints written with the attributes: the same system attributes as
    `Trial.set_constraint`, so feasibility (all <= 0) reads the same to samplers and readers."""
    storage = f"sqlite:///{tmp_path / 'o.db'}" if kind == "sqlite" else None
    study = optuna.create_study(study_name="s", storage=storage)
    by_optuna, batched = study.ask(), study.ask()
    for name, value in (("hours", 0.5), ("memory", -2.0)):
        by_optuna.set_constraint(name, value)
    set_user_attrs(batched, VALUES, constraints={"hours": 0.5, "memory": -2.0})
    study.tell(by_optuna, 1.0)
    study.tell(batched, 2.0)
    again = study if storage is None else optuna.load_study(study_name="s", storage=storage)
    first, second = again.trials
    assert first.system_attrs == second.system_attrs and second.user_attrs == VALUES
    assert any(key.endswith(":memory") for key in second.system_attrs)
    with pytest.raises(ValueError, match="'hours' is NaN"):
        set_user_attrs(study.ask(), {}, constraints={"hours": float("nan")})
