"""A live line for a study: trial n/N, best so far, counts per state, elapsed and remaining."""

from __future__ import annotations

import sys
from typing import Any

import optuna

from hpo.states import state_counts, trial_loss, trials_snapshot


class StudyProgress:
    """An Optuna callback drawing a tqdm bar (tqdm gives elapsed and remaining time)."""

    def __init__(self, total: int, already_done: int, *, enabled: bool = True) -> None:
        from tqdm.auto import tqdm

        self.bar: Any = tqdm(
            total=total,
            initial=already_done,
            desc="trials",
            unit="trial",
            file=sys.stderr,
            disable=not enabled,
            dynamic_ncols=True,
        )

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        trials = trials_snapshot(study)
        counts = state_counts(study, trials)
        postfix = {
            "complete": counts["complete"],
            "pruned": counts["pruned"],
            "failed": counts["failed"],
        }
        complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
        losses = [loss for t in complete if (loss := trial_loss(t)) is not None]
        if losses:
            postfix["best"] = f"{min(losses):.4f}"  # type: ignore[assignment]
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
