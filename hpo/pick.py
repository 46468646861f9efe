"""Which trial a study exports: the best, one named, or the cheapest that is nearly as good.

Once a configuration's full run has reported back (`hpo.full_run_reports`), "the best" weighs what
it measured: the best configuration without a full run is picked only where its predicted
level is below the lowest measured loss; otherwise the configuration that measured it is.

The trade-off a user weighs is predicted final loss against the full run's cost (its price
per hour times its predicted hours; hours when no price is set). `cheapest-within PCT`
takes the cheapest configuration that fits the window and whose predicted loss is within
PCT % of the best that fits: often a faster profile gives up a fraction of a percent of
loss for a much shorter run.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import optuna

from analysis.report.pareto import cheapest_within
from common.errors import BadInputError
from hpo.final_loss import TrialCurve, loss_one_doubling_on
from hpo.full_run_reports import MeasuredRun, measured_by_trial
from hpo.keys import (
    ESTIMATE_ATTR,
    LAW_CURVE_ATTR,
    PREDICTED_ATTR,
    PROMOTED_FROM_ATTR,
    RUNG_ATTR,
    SCORED_BY_ATTR,
)
from hpo.states import trial_loss

_PREDICTION, _DOUBLING = "prediction", "loss_one_doubling_on"  # `SCORED_BY_ATTR` values


def rung_of(trial: optuna.trial.FrozenTrial | optuna.Trial) -> int:
    """The trial's rung: 0 for a first trial, 1 for a promotion without a recorded rung
    (a study of one rung, `--promote`)."""
    attrs = trial.user_attrs
    if attrs.get(PROMOTED_FROM_ATTR) is None:
        return 0
    rung = attrs.get(RUNG_ATTR)
    return int(rung) if isinstance(rung, int) else 1


def rung_candidates(
    trials: Sequence[optuna.trial.FrozenTrial],
    depth: int,
    keep: int,
    measured: Collection[int] = (),
) -> list[optuna.trial.FrozenTrial]:
    """The trials rung `depth` continues: the `keep` best complete trials of the rung before
    (by value, then number), leaving out those already continued and those whose
    configuration's full run reported back (`measured`: trial numbers). A rung chooses: it
    leaves one of them behind at least, and continues none of a single one."""
    done = {t.user_attrs.get(PROMOTED_FROM_ATTR) for t in trials} - {None}
    rung = [
        t
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE
        and rung_of(t) == depth - 1
        and t.number not in measured
        and t.user_attrs.get(PROMOTED_FROM_ATTR) not in measured
    ]
    scores = comparable_losses(rung)
    before = [(v, t.number, t) for t in rung if (v := scores[t.number]) is not None]
    keep = min(keep, len(before) - 1)
    best = [t for _, _, t in sorted(before, key=lambda item: item[:2])[:keep]]
    return [t for t in best if t.number not in done]


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
    return min(furthest_rung(_candidates(study)), key=score_order)


def _candidates(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The standing trials that fit the window; all standing ones where none fits."""
    standing = standing_trials(study)
    if not standing:
        raise BadInputError(f"study '{study.study_name}' has no complete trial to export")
    return [t for t in standing if _fits(t)] or standing


def comparable_losses(trials: Sequence[optuna.trial.FrozenTrial]) -> dict[int, float | None]:
    """Each trial's score (None: none), on one footing across `trials`.

    A trial is scored by its predicted end where the study's backtest trusted the law when
    the trial ended, else by a loss it measured (`hpo.final_loss.trial_score`), and that
    verdict changes as trials end: one rung can hold both kinds. A predicted end lies below
    any loss measured partway, so ranked together the predicted ones win whatever they
    measured (the demo study at seed 2 continued a configuration predicted at 3.91 over one
    that measured 4.89 at the same share of its data and whose full run ends 1.1 lower).
    Where the kinds mix, every trial is ranked by the measured kind, recomputed from its
    recorded curve: its loss one doubling on where any was scored so, else its last loss.
    """
    scores = {t.number: trial_loss(t) for t in trials}
    kinds = {t.user_attrs.get(SCORED_BY_ATTR) for t in trials}
    if _PREDICTION not in kinds or len(kinds) < 2:
        return scores
    doubling = _DOUBLING in kinds
    for trial in trials:
        curve = TrialCurve.from_attr(trial.user_attrs.get(LAW_CURVE_ATTR))
        if curve is not None and curve.losses and scores[trial.number] is not None:
            scores[trial.number] = (
                loss_one_doubling_on(curve.samples, curve.losses) if doubling else curve.losses[-1]
            )
    return scores


def comparable_order(
    trials: Sequence[optuna.trial.FrozenTrial],
) -> list[optuna.trial.FrozenTrial]:
    """`trials` best first by their comparable scores (`comparable_losses`), then number;
    those without a score last."""
    scores = comparable_losses(trials)
    return sorted(trials, key=lambda t: (_or_inf(scores[t.number]), t.number))


def best_of(trials: Sequence[optuna.trial.FrozenTrial]) -> optuna.trial.FrozenTrial:
    """The trial of `trials` with the lowest comparable score (`comparable_losses`), then
    the lowest number; those without a score last."""
    return comparable_order(trials)[0]


def _or_inf(value: float | None) -> float:
    return float("inf") if value is None else value


def furthest_rung(trials: Sequence[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """Those of `trials` at the furthest rung any reached: the rungs chose them over the
    rest, and their scores are at more data (empty for no trials)."""
    furthest = max((rung_of(t) for t in trials), default=0)
    return [t for t in trials if rung_of(t) == furthest]


def measured_standing(
    study: optuna.Study, trials: list[optuna.trial.FrozenTrial] | None = None
) -> dict[int, MeasuredRun]:
    """Each of `trials` (default: the standing ones) whose configuration's full run reported
    back: its most recent run. A promoted trial stands for its first trial's configuration,
    so a full run exported from either counts for it."""
    by_trial = measured_by_trial(study.user_attrs)
    if not by_trial:
        return {}
    out = {}
    for trial in standing_trials(study) if trials is None else trials:
        sources = (trial.number, trial.user_attrs.get(PROMOTED_FROM_ATTR))
        found = [by_trial[n] for n in sources if n in by_trial]
        if found:
            out[trial.number] = max(found, key=lambda run: run.added_at)
    return out


def _against_measured(
    candidates: list[optuna.trial.FrozenTrial],
    measured: Mapping[int, MeasuredRun],
    losses: Mapping[int, float] | None,
    rule: str,
) -> tuple[optuna.trial.FrozenTrial, str] | None:
    """The lowest measured loss against the best configuration without a full run (by the
    study's own order), through that one's predicted level. None where no candidate has a
    full run."""
    trained = [t for t in candidates if t.number in measured]
    if not trained:
        return None
    done = min(trained, key=lambda t: (measured[t.number].loss, t.number))
    ran = measured[done.number]
    untrained = [t for t in candidates if t.number not in measured]
    best = best_of(furthest_rung(untrained)) if untrained else None
    level = _predicted_level(best, losses) if best is not None else None
    if best is not None and level is not None and level < ran.loss:
        return best, (
            f"{rule}: predicted {level:.4f}, below the {ran.loss:.4f} that trial "
            f"{done.number}'s full run measured"
        )
    why = ""
    if best is not None and level is not None:
        why = f", below trial {best.number}'s predicted {level:.4f}"
    return done, f"measured: its full run {ran.ended()}{why}"


def _predicted_level(
    trial: optuna.trial.FrozenTrial, losses: Mapping[int, float] | None
) -> float | None:
    """The trial's predicted final loss (p50): its end refit, else as recorded."""
    if losses is not None and trial.number in losses:
        return float(losses[trial.number])
    p50 = (trial.user_attrs.get(PREDICTED_ATTR) or {}).get("p50")
    return float(p50) if isinstance(p50, (int, float)) else None


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
        losses: Predicted final losses by trial number that `within_pct`, and the best
            against a measured full run, compare instead of those the trials recorded
            (`hpo.export.end_predictions`). A full run's measured loss replaces its
            configuration's.

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
        candidates = _candidates(study)
        measured = measured_standing(study, candidates)
        return _against_measured(candidates, measured, losses, rule) or (
            best_of(furthest_rung(candidates)),
            rule,
        )
    if not within_pct >= 0:
        raise BadInputError(f"cheapest-within needs a percentage >= 0, but got {within_pct!r}")
    # A configuration whose full run reported back compares what it measured.
    ran = {n: run.loss for n, run in measured_standing(study).items()}
    losses = {**(losses or {}), **ran}
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
    estimate: dict[str, Any] = attrs.get(ESTIMATE_ATTR) or {}
    hours = (estimate.get("duration_hours") or {}).get("p50", float("inf"))
    cost = (estimate.get("cost") or {}).get("p50") if estimate.get("price_per_hour") else None
    return float(loss if loss is not None else float("inf")), float(cost or hours)


def _fits(trial: optuna.trial.FrozenTrial) -> bool:
    return bool((trial.user_attrs.get(ESTIMATE_ATTR) or {}).get("fits_window", True))
