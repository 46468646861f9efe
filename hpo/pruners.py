"""Optuna pruners by name, with resources measured in optimizer steps."""

from __future__ import annotations

import optuna

from common.errors import BadInputError


def make_pruner(name: str, *, eval_interval: int, max_steps: int) -> optuna.pruners.BasePruner:
    """Build the pruner `name`; a trial reports its validation loss every `eval_interval` steps."""
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=eval_interval, max_resource=max_steps, reduction_factor=3
        )
    if name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=eval_interval, reduction_factor=3
        )
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=eval_interval)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise BadInputError(
        f"pruner must be one of hyperband, successive_halving, median, none, but got {name=}"
    )
