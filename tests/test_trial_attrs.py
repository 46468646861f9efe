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


def _storage_for(kind: str, tmp_path: Path, postgres_url: str | None) -> str:
    if kind == "postgresql":
        assert postgres_url is not None
        return postgres_url
    return f"sqlite:///{tmp_path / 'o.db'}"


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_one_upsert_overwrites_and_refuses_a_finished_trial(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Many keys in one statement: a key written again takes its new value (as
    `set_user_attr` does), and a finished trial is not written (Optuna's check)."""
    url = _storage_for(
        kind, tmp_path, request.getfixturevalue("postgres") if kind != "sqlite" else None
    )
    from hpo.storage import make_storage

    storage = make_storage(url)
    study = optuna.create_study(study_name=f"upsert-{kind}-{tmp_path.name}", storage=storage)
    trial = study.ask()
    set_user_attrs(trial, VALUES, constraints={"hours": 0.5})
    changed = {"lora_r": 16, "new": [1, 2]}
    set_user_attrs(trial, changed, constraints={"hours": -1.0})
    study.tell(trial, 1.0)
    read = optuna.load_study(study_name=study.study_name, storage=make_storage(url)).trials[0]
    assert read.user_attrs == {**VALUES, **changed}
    assert read.constraints == {"hours": -1.0}
    with pytest.raises(RuntimeError, match="finished"):
        set_user_attrs(trial, {"late": 1})
