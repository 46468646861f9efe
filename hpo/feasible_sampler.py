"""The study's sampler, with joint proposals whose full run cannot fit drawn again.

TPE with `group=True` models the per-profile parameters (``micro_batch_size@fast``) apart
from `lora_r`, `packing` and `quantization`, so choices that are each good combine into a
full run beyond the window. Each such proposal became a trial that was refused before
training: sampling, checking and storage writes, an Optuna trial and an MLflow run, for
nothing trained; in a window under half the space fits, a large share of a study's trials
(docs/notes/tuned-constants.md).

`FeasibleSampler` asks the wrapped sampler for its joint (relative) proposal and judges it
with the study's time model, the check the trial would make. One that would not fit is drawn
again, up to `ATTEMPTS` draws in all: sampling from the proposal restricted to what fits. TPE
picks each draw as the best of its candidates by its model, so draws repeat where that model
prefers the misfits; the last one is then repaired: its time-relevant choices (profile,
micro-batch, accumulation, rank, packing, quantization) become those of the nearest
configuration that fits (fewest choices changed), the rest of TPE's proposal kept. A redraw
that cannot be judged (onto a profile TPE has not modelled yet, whose batch choices are then
drawn apart, unjudged) is no way out: after the last draw the misfit is repaired. When none
fits nearby the draw goes on and is refused as before, and TPE learns the constraint from
it. Only TPE is wrapped: its draws are random given its state, while GP's acquisition
optimum or CMA-ES's generation bookkeeping would not survive being asked twice. Enqueued
trials (feasible starts, promotions, a user's `enqueue_trial`) keep what they fixed;
proposals during TPE's random start-up are independent draws and pass unjudged. A trial
whose configuration took more than one draw says how many in its system attribute
`REDRAWN_ATTR`, and `REPAIRED_ATTR` when it was repaired.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import optuna
from optuna.samplers import BaseSampler

from hpo.keys import REDRAWN_ATTR, REPAIRED_ATTR

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.study import Study
    from optuna.trial import FrozenTrial, TrialState

# Draws per trial before repairing: a TPE draw costs ~10-25 ms at a few hundred trials and a
# check a few ms, against ~0.08 s for the refused trial they replace.
ATTEMPTS = 3

# The judge: True fits, False does not, None cannot tell (a time-relevant choice missing).
Judge = Callable[[Mapping[str, Any]], "bool | None"]
# The repair: the proposal with its time-relevant choices moved to a nearby fit, or None.
Repair = Callable[[Mapping[str, Any]], "dict[str, Any] | None"]


class FeasibleSampler(BaseSampler):
    """`base` with its relative proposals judged by `fits`, drawn again when they do not,
    and the last draw repaired.

    Args:
        base: The study's sampler (TPE).
        fits: Judges a proposal's parameters (Optuna names) by the study's time model.
        repair: Moves a proposal that does not fit to a nearby one that does (or None).
        attempts: Draws per trial before the last one is repaired.
    """

    def __init__(
        self,
        base: BaseSampler,
        fits: Judge,
        repair: Repair | None = None,
        *,
        attempts: int = ATTEMPTS,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, but got {attempts=}")
        self.base = base
        self.fits = fits
        self.repair = repair
        self.attempts = attempts
        self.redrawn = 0  # proposals drawn again in this process
        self.repaired = 0  # and repaired

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        fixed = trial.system_attrs.get("fixed_params") or {}
        params = self.base.sample_relative(study, trial, search_space)
        if not params or fixed:
            return params  # start-up (independent draws), or an enqueued configuration
        draws, misfit = 1, None
        while (verdict := self.fits(params)) is not True:
            if verdict is None and misfit is None:
                break  # undecidable as first drawn (a profile TPE has not modelled): explore
            # A redraw onto a profile TPE has not modelled yet cannot be judged (its batch
            # choices are drawn apart, after this): the misfit drawn before it is repaired.
            misfit = params if verdict is False else misfit
            if draws == self.attempts:
                repaired = self.repair(misfit) if self.repair and misfit else None
                self._record(study, trial, draws, repaired=repaired is not None)
                return params if repaired is None else repaired
            params = self.base.sample_relative(study, trial, search_space)
            draws += 1
        if draws > 1:
            self._record(study, trial, draws, repaired=False)
        return params

    def _record(self, study: Study, trial: FrozenTrial, draws: int, *, repaired: bool) -> None:
        self.redrawn += draws - 1
        self.repaired += repaired
        storage = study._storage
        storage.set_trial_system_attr(trial._trial_id, REDRAWN_ATTR, draws)
        if repaired:
            storage.set_trial_system_attr(trial._trial_id, REPAIRED_ATTR, True)

    def sample_independent(self, *args: Any, **kwargs: Any) -> Any:
        return self.base.sample_independent(*args, **kwargs)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()


def redraw_infeasible(
    study: optuna.Study, fits: Judge, repair: Repair | None = None
) -> FeasibleSampler | None:
    """Wrap the study's sampler when it is TPE (see the module); the wrapper, or None."""
    sampler = study.sampler
    if isinstance(sampler, FeasibleSampler):
        return sampler
    if not isinstance(sampler, optuna.samplers.TPESampler):
        return None
    study.sampler = FeasibleSampler(sampler, fits, repair)
    return study.sampler


def redraw_counts(trials: Sequence[FrozenTrial]) -> dict[str, int]:
    """Over a study's trials (all workers): how many took more than one draw, the draws
    beyond the first, and how many were repaired; empty when none."""
    drawn = [t for t in trials if REDRAWN_ATTR in t.system_attrs]
    if not drawn:
        return {}
    return {
        "trials": len(drawn),
        "extra_draws": sum(int(t.system_attrs[REDRAWN_ATTR]) - 1 for t in drawn),
        "repaired": sum(bool(t.system_attrs.get(REPAIRED_ATTR)) for t in drawn),
    }


def redraw_line(counts: dict[str, int]) -> str:
    """The summary's line on `redraw_counts`."""
    return (
        f"{counts['trials']} proposals of the sampler would not have fit the window: drawn "
        f"again before training ({counts['extra_draws']} extra draws, {counts['repaired']} "
        "repaired to the nearest configuration that fits)"
    )
