"""Optuna pruners by name, with resources measured in evaluations at equal data.

A trial reports its k-th of `evals` evaluations as step k, after k / evals of its samples
(`hpo.objective.OptunaReporter`), so rungs compare configurations that have seen the same
data, whatever their batch sizes.
"""

from __future__ import annotations

import optuna

from common.errors import BadInputError


def make_pruner(name: str, *, evals: int) -> optuna.pruners.BasePruner:
    """Build the pruner `name`; a trial reports its validation loss `evals` times (steps 1..evals)."""
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=1, max_resource=evals, reduction_factor=3
        )
    if name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise BadInputError(
        f"pruner must be one of hyperband, successive_halving, median, none, but got {name=}"
    )
