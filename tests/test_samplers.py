"""One suite every sampler ``make_sampler`` builds must pass (like Optuna's sampler tests)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from typing import Literal

import optuna
import pytest
from optuna.trial import TrialState

from common.errors import BadInputError
from hpo.samplers import make_sampler
from hpo.skopt_sampler import SkoptSampler
from tests.spaces import SAMPLERS

STARTUP = 3  # few random trials, so the short studies below exercise every model
CHOICES = ("a", "b", None, 3)


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        # skopt warns when it proposes a point twice, which tiny integer spaces invite.
        warnings.filterwarnings("ignore", message=".*evaluated at point.*")
        yield


def _every_kind(trial: optuna.Trial) -> float:
    """Suggests one parameter of every distribution kind and checks what comes back."""
    x = trial.suggest_float("x", -2.0, 2.0)
    lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
    q = trial.suggest_float("q", 0.0, 1.0, step=0.25)
    n = trial.suggest_int("n", 1, 9)
    s = trial.suggest_int("s", 0, 12, step=3)
    r = trial.suggest_int("r", 1, 64, log=True)
    c = trial.suggest_categorical("c", CHOICES)
    for value in (x, lr, q):
        assert isinstance(value, float)
    for value in (n, s, r):
        assert isinstance(value, int) and not isinstance(value, bool)
    assert -2.0 <= x <= 2.0 and 1e-5 <= lr <= 1e-1
    assert q in (0.0, 0.25, 0.5, 0.75, 1.0)
    assert 1 <= n <= 9 and s in (0, 3, 6, 9, 12) and 1 <= r <= 64
    assert c in CHOICES
    return x**2 + (math.log10(lr) + 3) ** 2 / 9 + q + abs(n - 5) + s / 12 + abs(r - 8) / 64


def _run(
    name: str,
    objective: Callable[[optuna.Trial], float],
    n_trials: int,
    *,
    direction: Literal["minimize", "maximize"] = "minimize",
    startup: int = STARTUP,
) -> optuna.Study:
    sampler = make_sampler(name, seed=7, n_startup_trials=startup)
    study = optuna.create_study(sampler=sampler, direction=direction)
    study.optimize(objective, n_trials=n_trials)
    return study


@pytest.mark.parametrize("name", SAMPLERS)
def test_values_stay_inside_their_distributions(name: str) -> None:
    study = _run(name, _every_kind, n_trials=8)
    assert all(trial.state == TrialState.COMPLETE for trial in study.trials)


@pytest.mark.parametrize("name", SAMPLERS)
def test_same_seed_gives_the_same_sequence_in_either_direction(name: str) -> None:
    first = _run(name, _every_kind, n_trials=6)
    second = _run(name, _every_kind, n_trials=6)
    # Maximizing -f must visit what minimizing f visits: checks the sign handling.
    mirrored = _run(name, lambda trial: -_every_kind(trial), n_trials=6, direction="maximize")
    params = [t.params for t in first.trials]
    assert [t.params for t in second.trials] == params
    assert [t.params for t in mirrored.trials] == params
    assert mirrored.best_value == -first.best_value


@pytest.mark.parametrize("name", SAMPLERS)
def test_pruned_and_failed_trials_in_history(name: str) -> None:
    study = optuna.create_study(sampler=make_sampler(name, seed=7, n_startup_trials=STARTUP))
    for number in range(8):
        trial = study.ask()
        value = _every_kind(trial)
        if number % 4 == 1:
            trial.report(value, step=0)
            trial.report(value / 2, step=1)
            study.tell(trial, state=TrialState.PRUNED)
        elif number % 4 == 2:
            study.tell(trial, state=TrialState.PRUNED)  # pruned before reporting anything
        elif number % 4 == 3:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, value)
    study.optimize(_every_kind, n_trials=3)
    assert [t.state for t in study.trials[-3:]] == [TrialState.COMPLETE] * 3


@pytest.mark.parametrize("name", SAMPLERS)
def test_improves_on_a_quadratic(name: str) -> None:
    def quadratic(trial: optuna.Trial) -> float:
        x, y = trial.suggest_float("x", -1.0, 1.0), trial.suggest_float("y", -1.0, 1.0)
        return (x - 0.3) ** 2 + (y + 0.2) ** 2

    study = _run(name, quadratic, n_trials=25, startup=10)
    # Random search meets 0.3 in 25 trials with probability 1 - (1 - 0.236) ** 25 > 0.998.
    assert study.best_value < 0.3


def test_unknown_sampler_names_the_value() -> None:
    with pytest.raises(BadInputError, match="'anneal'"):
        make_sampler("anneal")


def test_bad_startup_names_the_value() -> None:
    with pytest.raises(BadInputError, match="n_startup_trials=0"):
        make_sampler("tpe", n_startup_trials=0)


def test_skopt_rejects_multi_objective() -> None:
    study = optuna.create_study(
        sampler=SkoptSampler(n_startup_trials=1, seed=0), directions=["minimize"] * 2
    )
    with pytest.raises(ValueError):
        study.optimize(lambda t: (t.suggest_float("x", 0, 1), t.suggest_float("y", 0, 1)), 3)
