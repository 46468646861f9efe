"""Names of Optuna's finished trial states, as the study reports and MLflow shows them."""

from __future__ import annotations

from collections.abc import Iterable

import optuna

STATE_NAMES = {
    optuna.trial.TrialState.COMPLETE: "complete",
    optuna.trial.TrialState.PRUNED: "pruned",
    optuna.trial.TrialState.FAIL: "failed",
}


# The states a finished trial can be in, in counting order.
FINISHED_STATES = tuple(STATE_NAMES)


def state_counts(
    study: optuna.Study, trials: Iterable[optuna.trial.FrozenTrial] | None = None
) -> dict[str, int]:
    """Finished trials per state: complete, pruned, failed (of `trials`, else read)."""
    if trials is None:
        trials = study.get_trials(deepcopy=False, states=tuple(STATE_NAMES))
    return count_states(t for t in trials if t.state in STATE_NAMES)


def trials_after_tell(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The study's trials for the callbacks after a trial, read from the storage once.

    Optuna keeps a per-thread snapshot of the trials that `tell` and `ask` clear: the first
    callback after a trial reads the storage (a read costs about 3 ms on SQLite, with the
    new trial in it), the others share it. Only for the thread that runs the trials (another
    thread's snapshot would never be cleared); not frozen copies, so read-only.
    """
    return _snapshot(study)


def trials_seen_by_sampler(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The study's trials as the sampler saw them when this trial began (same snapshot).

    Within a trial, for what needs the other trials but not ones finished since it began:
    the trial's own record in it is as of its start. A peer worker's trial that ended while
    this one trained is missing (the next trial sees it); with one worker nothing is.
    """
    return _snapshot(study)


def _snapshot(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    getter = getattr(study, "_get_trials", None)
    if getter is None:  # an Optuna without the snapshot
        return study.get_trials(deepcopy=False)
    trials: list[optuna.trial.FrozenTrial] = getter(deepcopy=False, use_cache=True)
    return trials


def count_states(trials: Iterable[optuna.trial.FrozenTrial]) -> dict[str, int]:
    counts = dict.fromkeys(STATE_NAMES.values(), 0)
    for trial in trials:
        counts[STATE_NAMES[trial.state]] += 1
    return counts


def trial_loss(trial: optuna.trial.FrozenTrial) -> float | None:
    """A finished trial's loss: its value, or its first value in a multi-objective study."""
    return float(trial.values[0]) if trial.values else None
