"""An Optuna sampler backed by scikit-optimize's ask/tell ``Optimizer``.

optuna-integration 5 no longer ships one, so this is a small port of its former
``SkoptSampler`` onto the public Optuna 5 sampler API.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, RandomSampler
from optuna.search_space import intersection_search_space
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

# skopt 0.10's regressor check rejects these under scikit-learn's estimator tags (seen with
# scikit-learn 1.9); GP, RF and ET work.
_BROKEN_ESTIMATORS = ("GBRT", "dummy")


class SkoptSampler(BaseSampler):
    """Bayesian optimisation with scikit-optimize (Gaussian process by default).

    Each relative sample builds a fresh ``skopt.Optimizer`` over the parameters every
    observed trial shares, tells it every observation and asks it for one point.
    Observations are completed trials and pruned trials with their last reported
    intermediate value; failed trials are skipped. Parameters outside that shared space
    (conditional ones) are drawn by a :class:`~optuna.samplers.RandomSampler`.

    References:
        T. Head, M. Kumar, H. Nahrstaedt, G. Louppe, I. Shcherbatyi et al.,
        scikit-optimize v0.10.2 (2024), https://doi.org/10.5281/zenodo.11478072 .
        J. Snoek, H. Larochelle, R. P. Adams, "Practical Bayesian Optimization of Machine
        Learning Algorithms", NeurIPS 2012 (the GP approach it implements).

    Args:
        n_startup_trials: Observations needed before the model is used; until then every
            parameter is drawn at random.
        seed: Seed for the random draws and for each ``skopt.Optimizer``.
        skopt_kwargs: Keyword arguments for ``skopt.Optimizer`` (default
            ``base_estimator="GP"``; ``"RF"`` and ``"ET"`` work too); ``dimensions`` and
            ``random_state`` are set here.
    """

    def __init__(
        self,
        *,
        n_startup_trials: int = 10,
        seed: int | None = None,
        skopt_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if n_startup_trials < 1:
            raise ValueError(f"n_startup_trials must be >= 1, but got {n_startup_trials=}")
        self._n_startup_trials = n_startup_trials
        self._rng = np.random.RandomState(seed)
        self._random_sampler = RandomSampler(seed=seed)
        # n_initial_points=0: our own start-up phase replaces skopt's.
        self._skopt_kwargs = {"base_estimator": "GP", "n_initial_points": 0, **(skopt_kwargs or {})}
        for reserved in ("dimensions", "random_state"):
            self._skopt_kwargs.pop(reserved, None)
        estimator = self._skopt_kwargs["base_estimator"]
        if estimator in _BROKEN_ESTIMATORS:
            raise ValueError(f"skopt 0.10 fails with this scikit-learn for {estimator=}")

    def reseed_rng(self) -> None:
        """Reseeds the random draws (Optuna calls this in each worker process)."""
        self._rng.seed()
        self._random_sampler.reseed_rng()

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        """The distributions every observed trial shares, minus single-value ones."""
        trials = [observed for observed, _ in _observations(study)]
        space = intersection_search_space(trials, include_pruned=True)
        return {name: dist for name, dist in space.items() if not dist.single()}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        """Fits skopt's model to the observations and asks it for one point."""
        self._raise_error_if_multi_objective(study)
        if not search_space:
            return {}
        space = sorted(search_space.items())
        sign = -1.0 if study.direction == StudyDirection.MAXIMIZE else 1.0  # skopt minimizes
        xs, ys = [], []
        for observed, value in _observations(study):
            # A trial that finished after infer_relative_search_space may not fit the space.
            if all(observed.distributions.get(name) == dist for name, dist in space):
                xs.append([_to_skopt(dist, observed.params[name]) for name, dist in space])
                ys.append(sign * value)
        if len(xs) < self._n_startup_trials:
            return {}
        from skopt import Optimizer  # imports scikit-learn: slow, so only when needed

        optimizer = Optimizer(
            [_dimension(dist) for _, dist in space],
            random_state=int(self._rng.randint(2**31 - 1)),
            **self._skopt_kwargs,
        )
        optimizer.tell(xs, ys)
        point = optimizer.ask()
        return {name: _from_skopt(dist, x) for (name, dist), x in zip(space, point, strict=True)}

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        """Draws a parameter outside the relative search space at random."""
        return self._random_sampler.sample_independent(study, trial, param_name, param_distribution)


def _observations(study: Study) -> list[tuple[FrozenTrial, float]]:
    """Completed trials with their value and pruned ones with their last intermediate value."""
    states = (TrialState.COMPLETE, TrialState.PRUNED)
    observations = []
    for trial in study.get_trials(deepcopy=False, states=states):
        if trial.state == TrialState.COMPLETE:
            value = trial.value
        elif trial.intermediate_values:
            value = trial.intermediate_values[max(trial.intermediate_values)]
        else:
            continue
        if value is not None and math.isfinite(value):
            observations.append((trial, float(value)))
    return observations


def _grid(dist: IntDistribution | FloatDistribution) -> tuple[float, float] | None:
    """``(low, step)`` of a linear grid, which skopt sees as an integer index; else None."""
    if isinstance(dist, IntDistribution) and not dist.log:
        return dist.low, dist.step
    if isinstance(dist, FloatDistribution) and dist.step is not None:
        return dist.low, dist.step
    return None


def _numeric(dist: BaseDistribution) -> IntDistribution | FloatDistribution:
    if not isinstance(dist, (IntDistribution, FloatDistribution)):
        raise NotImplementedError(f"SkoptSampler does not support {dist!r}")
    return dist


def _dimension(dist: BaseDistribution) -> Any:
    from skopt.space import Categorical, Integer, Real

    if isinstance(dist, CategoricalDistribution):
        # Indices, not the choices: skopt mishandles None and mixed-type categories.
        return Categorical(list(range(len(dist.choices))))
    dist = _numeric(dist)
    grid = _grid(dist)
    if grid is not None:
        return Integer(0, round((dist.high - grid[0]) / grid[1]))
    prior = "log-uniform" if dist.log else "uniform"
    if isinstance(dist, FloatDistribution):
        return Real(dist.low, dist.high, prior=prior)
    return Integer(dist.low, dist.high, prior=prior)


def _to_skopt(dist: BaseDistribution, value: Any) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return int(dist.to_internal_repr(value))
    grid = _grid(_numeric(dist))
    return value if grid is None else round((value - grid[0]) / grid[1])


def _from_skopt(dist: BaseDistribution, x: Any) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[int(x)]
    dist = _numeric(dist)
    grid = _grid(dist)
    value = x if grid is None else grid[0] + int(x) * grid[1]
    value = min(max(value, dist.low), dist.high)  # skopt's log transform can overshoot a bound
    return int(value) if isinstance(dist, IntDistribution) else float(value)
