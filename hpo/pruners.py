"""Optuna pruners by name, with resources measured in evaluations at equal data.

A trial reports its k-th of `evals` evaluations as step k, after k / evals of its samples
(`hpo.objective.OptunaReporter`), so rungs compare configurations that have seen the same
data, whatever their batch sizes.
"""

from __future__ import annotations

from typing import Any

import optuna

from common.errors import BadInputError


class HyperbandPruner(optuna.pruners.HyperbandPruner):
    """Optuna's Hyperband, its bracket views of the study made once per study, not per use.

    Optuna hands the sampler and the pruner a view of the study per bracket, and makes a
    new one each time: at each suggested parameter and each report. Each new view asks the
    storage for the study's id and directions and has its own per-trial cache of the
    trials, so TPE (which reads every trial through that cache) went to the storage at each
    parameter: most of a short trial's sampling time. Here a bracket's view is made once
    and shares the study's per-trial cache, which Optuna empties at each ask and tell, as
    it does for the study itself. The views filter and prune exactly as Optuna's do.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._views: dict[tuple[int, int], tuple[optuna.Study, optuna.Study]] = {}

    def _create_bracket_study(self, study: optuna.Study, bracket_id: int) -> optuna.Study:
        key = (id(study), bracket_id)
        kept = self._views.get(key)
        if kept is not None and kept[0] is study:
            return kept[1]
        view = super()._create_bracket_study(study, bracket_id)
        # The view's own cache would outlive the trial; the study's is emptied at ask/tell.
        object.__setattr__(view, "_thread_local", study._thread_local)
        self._views[key] = (study, view)
        return view


def make_pruner(name: str, *, evals: int) -> optuna.pruners.BasePruner:
    """Build the pruner `name`; a trial reports its validation loss `evals` times (steps 1..evals)."""
    if name == "hyperband":
        return HyperbandPruner(min_resource=1, max_resource=evals, reduction_factor=3)
    if name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise BadInputError(
        f"pruner must be one of hyperband, successive_halving, median, none, but got {name=}"
    )
