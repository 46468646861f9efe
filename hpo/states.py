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


def trials_snapshot(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The study's trials from Optuna's per-thread snapshot, read from the storage once.

    Optuna keeps a per-thread snapshot of the trials that `ask` and `tell` clear. After a
    trial, the first callback reads the storage (about 3 ms on SQLite, with the new trial in
    it) and the others share it. Within a trial it is what the sampler read at the trial's
    start: the trial's own record as of then, and a peer worker's trial that ended while
    this one trained is missing (the next trial sees it); with one worker nothing is. Only
    for the thread that runs the trials (another thread's snapshot would never be cleared);
    not frozen copies, so read-only.
    """
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
