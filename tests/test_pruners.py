"""The Hyperband pruner of `hpo.pruners`: Optuna's decisions, with fewer storage reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo.pruners import make_pruner
from hpo.storage import make_storage


def _objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -3.0, 3.0)
    kind = trial.suggest_categorical("kind", ["a", "b", "c"])
    # Per-kind parameters, as a study's per-profile choices: TPE draws them one by one.
    width = trial.suggest_int(f"width_{kind}", 1, 8)
    depth = trial.suggest_int(f"depth_{kind}", 1, 4)
    level = (x - 1.0) ** 2 + {"a": 0.0, "b": 0.5, "c": 1.0}[kind] + 0.1 * width + 0.05 * depth
    for step in range(1, 7):
        trial.report(level + 1.0 / step, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return level


def _study(tmp_path: Path, name: str, pruner: optuna.pruners.BasePruner) -> tuple[Any, Any]:
    reads = {"all_trials": 0, "study_id": 0}

    def counted_all_trials(*args: Any, **kwargs: Any) -> Any:
        reads["all_trials"] += 1
        return all_trials(*args, **kwargs)

    def counted_study_id(*args: Any, **kwargs: Any) -> Any:
        reads["study_id"] += 1
        return study_id(*args, **kwargs)

    study = optuna.create_study(
        study_name="same",  # Hyperband's brackets hash the study's name
        storage=make_storage(f"sqlite:///{tmp_path / name}.db"),
        sampler=optuna.samplers.TPESampler(seed=3, n_startup_trials=4, multivariate=True),
        pruner=pruner,
    )
    # What the study reads through (Optuna wraps an RDB storage in its cache).
    storage = study._storage
    all_trials, study_id = storage.get_all_trials, storage.get_study_id_from_name
    storage.get_all_trials = counted_all_trials  # type: ignore[method-assign]
    storage.get_study_id_from_name = counted_study_id  # type: ignore[method-assign]
    return study, reads


def test_hyperband_decides_as_optunas_and_reads_the_storage_less(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ours, our_reads = _study(tmp_path, "ours", make_pruner("hyperband", evals=6))
    theirs, their_reads = _study(
        tmp_path,
        "theirs",
        optuna.pruners.HyperbandPruner(min_resource=1, max_resource=6, reduction_factor=3),
    )
    ours.optimize(_objective, n_trials=24)
    theirs.optimize(_objective, n_trials=24)

    def record(study: optuna.Study) -> list[tuple[Any, ...]]:
        return [(t.state, t.params, t.value, dict(t.intermediate_values)) for t in study.trials]

    # The same configurations, prunings and values: every later trial's sampler saw the
    # earlier trials (a bracket view's snapshot that outlived its trial would change them).
    assert record(ours) == record(theirs)
    states = {t.state for t in ours.trials}
    assert optuna.trial.TrialState.PRUNED in states and optuna.trial.TrialState.COMPLETE in states
    # Optuna's view asks for the study's id at each suggestion and each report; ours once
    # per bracket. TPE's reads of every trial: once per trial, not at each suggestion.
    assert our_reads["study_id"] <= 5 < their_reads["study_id"]
    assert our_reads["all_trials"] < 0.8 * their_reads["all_trials"]


def test_other_pruners_are_optunas() -> None:
    assert type(make_pruner("median", evals=6)) is optuna.pruners.MedianPruner
    assert isinstance(make_pruner("hyperband", evals=6), optuna.pruners.HyperbandPruner)
    with pytest.raises(Exception, match="pruner must be one of"):
        make_pruner("nope", evals=6)
