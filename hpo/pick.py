"""Which trial a study exports: the best, one named, or the cheapest that is nearly as good.

The trade-off a user weighs is predicted final loss against the full run's cost (its price
per hour times its predicted hours; hours when no price is set). `cheapest-within PCT`
takes the cheapest configuration that fits the window and whose predicted loss is within
PCT % of the best that fits: often a faster profile gives up a fraction of a percent of
loss for a much shorter run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from analysis.report.pareto import cheapest_within
from common.errors import BadInputError
from hpo.final_loss import PREDICTED_ATTR
from hpo.states import trial_loss

PROMOTED_FROM_ATTR = "promoted_from"  # hpo.objective sets it on a promoted trial


def standing_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Complete trials, each configuration once: a promoted trial replaces its first trial.

    A promoted trial trained the same configuration on more data, so its prediction of the
    full run is the better informed one.
    """
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    superseded = {t.user_attrs.get(PROMOTED_FROM_ATTR) for t in complete} - {None}
    return [t for t in complete if t.number not in superseded]


def best_complete_trial(study: optuna.Study) -> optuna.trial.FrozenTrial:
    """The standing complete trial with the lowest loss of those that fit the window.

    A configuration is trained only when its full run is predicted to fit, but the time
    model learns from the trial itself and may then predict a longer run: such a trial is
    passed over while one that fits remains. In a multi-objective study (loss and hours or
    cost) the result is the best-loss feasible point of the Pareto front.
    """
    standing = standing_trials(study)
    if not standing:
        raise BadInputError(f"study '{study.study_name}' has no complete trial to export")
    fitting = [t for t in standing if _fits(t)]
    return min(fitting or standing, key=score_order)


def score_order(trial: optuna.trial.FrozenTrial) -> tuple[float, int]:
    """A sort key: by score (the loss the study minimised; none last), then trial number."""
    return _loss(trial), trial.number


def _loss(trial: optuna.trial.FrozenTrial) -> float:
    loss = trial_loss(trial)
    return float("inf") if loss is None else loss


def pick_trial(
    study: optuna.Study,
    *,
    trial: int | None = None,
    within_pct: float | None = None,
    losses: Mapping[int, float] | None = None,
) -> tuple[optuna.trial.FrozenTrial, str]:
    """The trial to export and the rule that picked it (recorded in the preset).

    Args:
        study: The study.
        trial: Export this trial number (it must be complete).
        within_pct: Export the cheapest feasible trial within this many percent of the best
            predicted loss.
        losses: Predicted final losses by trial number that `within_pct` compares instead
            of those the trials recorded (`hpo.export.end_predictions`).

    Raises:
        BadInputError: Both rules given, the trial is not complete, a negative percentage,
            or no complete trial.
    """
    if trial is not None and within_pct is not None:
        raise BadInputError("give either --trial or --pick cheapest-within, not both")
    if trial is not None:
        chosen = [t for t in study.get_trials(deepcopy=False) if t.number == trial]
        if not chosen or chosen[0].state != optuna.trial.TrialState.COMPLETE:
            raise BadInputError(f"trial {trial} of '{study.study_name}' is not a complete trial")
        return chosen[0], f"trial {trial}, chosen by hand"
    if within_pct is None:
        rule = "best predicted loss"
        if len(study.directions) > 1:
            rule = "best-loss point of the Pareto front"
        return best_complete_trial(study), rule
    if not within_pct >= 0:
        raise BadInputError(f"cheapest-within needs a percentage >= 0, but got {within_pct!r}")
    points = [(*loss_and_cost(t, losses), t.number) for t in standing_trials(study) if _fits(t)]
    point = cheapest_within(points, within_pct)
    if point is None:
        raise BadInputError(f"study '{study.study_name}' has no complete trial that fits")
    number = point[2]
    picked = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    return picked, f"cheapest within {within_pct:g} % of the best predicted loss"


def loss_and_cost(
    trial: optuna.trial.FrozenTrial, losses: Mapping[int, float] | None = None
) -> tuple[float, float]:
    """Predicted final loss (p50: from `losses` when it has the trial, else as recorded)
    and the full run's cost, else its hours (p50)."""
    attrs = trial.user_attrs
    loss = (attrs.get(PREDICTED_ATTR) or {}).get("p50", trial_loss(trial))
    if losses is not None and trial.number in losses:
        loss = losses[trial.number]
    estimate: dict[str, Any] = attrs.get("estimate") or {}
    hours = (estimate.get("duration_hours") or {}).get("p50", float("inf"))
    cost = (estimate.get("cost") or {}).get("p50") if estimate.get("price_per_hour") else None
    return float(loss if loss is not None else float("inf")), float(cost or hours)


def _fits(trial: optuna.trial.FrozenTrial) -> bool:
    return bool((trial.user_attrs.get("estimate") or {}).get("fits_window", True))
