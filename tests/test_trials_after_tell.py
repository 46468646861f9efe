"""The callbacks after a trial share one storage read of the study (`trials_snapshot`),
and each trial's callbacks see that trial finished."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import optuna.storages._rdb.storage as rdb

from hpo.states import state_counts, trials_snapshot
from hpo.storage import make_storage


def test_callbacks_after_a_trial_share_one_read_that_holds_it(
    tmp_path: Path, monkeypatch: Any
) -> None:
    reads: list[int] = []
    original = rdb.RDBStorage._get_trials

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(rdb.RDBStorage, "_get_trials", counted)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name="s", storage=make_storage(f"sqlite:///{tmp_path / 'o.db'}")
    )
    seen: list[tuple[int, dict[str, int], int]] = []

    def first(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        reads.clear()
        trials = trials_snapshot(study)
        seen.append((trial.number, state_counts(study, trials), len(trials)))

    def second(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        again = trials_snapshot(study)
        assert [t.number for t in again] == list(range(trial.number + 1))
        assert len(reads) == 1  # the first callback's read, shared

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", 0.0, 1.0)
        if trial.number == 1:
            raise optuna.TrialPruned()
        return x

    study.optimize(objective, n_trials=3, callbacks=[first, second])
    assert [n for n, _, _ in seen] == [0, 1, 2]
    # Each trial's callbacks count it: the snapshot was refreshed after its tell.
    assert [c["complete"] + c["pruned"] for _, c, _ in seen] == [1, 2, 3]
    assert seen[1][1] == {"complete": 1, "pruned": 1, "failed": 0}
