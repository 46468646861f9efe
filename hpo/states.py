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


def state_counts(study: optuna.Study) -> dict[str, int]:
    """Finished trials per state: complete, pruned, failed."""
    return count_states(study.get_trials(deepcopy=False, states=tuple(STATE_NAMES)))


def count_states(trials: Iterable[optuna.trial.FrozenTrial]) -> dict[str, int]:
    counts = dict.fromkeys(STATE_NAMES.values(), 0)
    for trial in trials:
        counts[STATE_NAMES[trial.state]] += 1
    return counts


def trial_loss(trial: optuna.trial.FrozenTrial) -> float | None:
    """A finished trial's loss: its value, or its first value in a multi-objective study."""
    return float(trial.values[0]) if trial.values else None
