"""Sampler names a study config may use, and the factory that builds them.

Search spaces here are conditional (per-profile parameters such as
``micro_batch_size@fast``) and categorical-heavy, so every sampler is set up for that:
TPE groups parameters that appear together, and the samplers that model only a shared
or a numeric space (GP, CMA-ES, skopt) draw the rest with a fallback sampler without
warning on every trial.
"""

from __future__ import annotations

import importlib.util
import warnings

import optuna
from optuna.samplers import BaseSampler

from common.errors import BadInputError
from hpo.skopt_sampler import SkoptSampler

SAMPLER_NAMES = ("tpe", "nsga2", "gp", "cmaes", "random", "skopt")


def make_sampler(
    name: str = "tpe", *, seed: int | None = None, n_startup_trials: int | None = None
) -> BaseSampler:
    """Builds an Optuna sampler by name.

    Args:
        name: One of ``tpe`` (default), ``nsga2`` (multi-objective studies), ``gp``,
            ``cmaes``, ``random``, ``skopt``.
        seed: Seed for every random draw of the sampler (and its fallback sampler).
        n_startup_trials: Random trials before the model is used; None keeps each
            sampler's default (10 for TPE, GP and skopt, 1 for CMA-ES). Ignored by
            ``random``.

    Returns:
        The sampler.

    Raises:
        BadInputError: Unknown name or ``n_startup_trials < 1``.
        ImportError: ``cmaes`` without the ``cmaes`` package installed.
    """
    if name not in SAMPLER_NAMES:
        raise BadInputError(f"sampler: unknown sampler {name!r}; known: {', '.join(SAMPLER_NAMES)}")
    if n_startup_trials is not None and n_startup_trials < 1:
        raise BadInputError(f"sampler: n_startup_trials must be >= 1, but got {n_startup_trials=}")
    startup = 10 if n_startup_trials is None else n_startup_trials
    if name == "tpe":
        with warnings.catch_warnings():
            # group=True is what makes multivariate TPE model per-profile parameters; it is
            # still marked experimental and would warn on every construction.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, n_startup_trials=startup
            )
    if name == "nsga2":
        # A genetic algorithm: its first generation (population_size trials) is random.
        # The per-profile parameters outside the shared space are drawn at random.
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=min(50, startup * 2))
    if name == "gp":
        # Short training runs give a noisy loss, hence deterministic_objective=False.
        return optuna.samplers.GPSampler(
            seed=seed,
            deterministic_objective=False,
            warn_independent_sampling=False,
            n_startup_trials=startup,
        )
    if name == "cmaes":
        if importlib.util.find_spec("cmaes") is None:
            raise ImportError("the cmaes sampler needs the 'cmaes' package: pip install cmaes")
        # CMA-ES models only numeric parameters; TPE handles the categorical ones
        # (profile, rank), which would otherwise be drawn at random.
        independent = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)
        return optuna.samplers.CmaEsSampler(
            seed=seed,
            independent_sampler=independent,
            warn_independent_sampling=False,
            n_startup_trials=n_startup_trials or 1,
        )
    if name == "skopt":
        return SkoptSampler(seed=seed, n_startup_trials=startup)
    return optuna.samplers.RandomSampler(seed=seed)
