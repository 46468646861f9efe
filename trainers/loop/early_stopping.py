"""Early stopping on the validation loss, and what a run's curves advise.

`EarlyStopping` follows the rule of transformers' `EarlyStoppingCallback` (stop after
`patience` evaluations without an improvement larger than `min_delta`), but lives in the
project's loop instead of being that callback: the loop's own checkpoints (staged, rotated,
by steps or by minutes) are what must hold the best adapter, a recovery restarts the Trainer
(and with it any Trainer callback's counter), and a resumed run carries the counter in its
`run_state.json`. `advise` reads the evaluation history for a run that does not learn (or
diverges), overfitting and a plateau, and says what to change, one line each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

# Overfitting: the best validation loss is at least this many evaluations old ...
OVERFIT_EVALS = 3
# ... while the training loss fell by more than this share since then.
TRAIN_DROP = 0.05
# A plateau: the last evaluations moved the validation loss by less than this share.
PLATEAU_RELATIVE_CHANGE = 0.005
# Not learning: no later evaluation went below the first by more than this share (the noise
# of one evaluation on a few dozen samples), while the training loss did not fall either.
NOT_LEARNING_DROP = 0.01
NOT_LEARNING_EVALS = 3
# A suggested learning rate for a run that does not learn: ten times lower (or higher), one
# step of the usual log-uniform grid (LoRA rates span about 1e-5 to 1e-3).
LR_STEP = 10.0
# Adam moves a weight by about the learning rate per step, whatever the gradient: a run whose
# rate times its steps stays under this moved its adapter too little to change the loss.
TOO_LOW_TRAVEL = 1e-2

OVERFITTING_ADVICE = (
    "overfitting: validation loss rose above its best ({best:.4f} at step {step}) while "
    "training loss kept falling; use fewer epochs, more LoRA dropout or weight decay, "
    "or a lower rank"
)
NOT_LEARNING_ADVICE = (
    "not learning: validation loss never went {pct:g} % below its first evaluation "
    "({first:.4f} at step {step}; {last:.4f} after {n} evaluations) and training loss did "
    "not fall either; the learning rate {lr} is likely too high: try {lower}"
)
NOT_MOVING_ADVICE = (
    "not learning: validation loss stayed within {pct:g} % of its first evaluation "
    "({first:.4f} at step {step}; {last:.4f} after {n} evaluations); the learning rate {lr} "
    "moves the adapter too little in {steps} steps: try {higher}"
)
DIVERGING_ADVICE = (
    "diverging: validation loss rose from its first evaluation ({first:.4f} at step {step}) "
    "to {last:.4f} while training loss did not fall; the learning rate {lr} is too high: "
    "try {lower}"
)
GAVE_UP_ADVICE = (
    "diverged: the loss became non-finite or exploded again after every rollback ({reason}); "
    "the learning rate {lr} is too high for this run: try {lower}, or more warm-up"
)
PLATEAU_ADVICE = (
    "plateau: validation loss changed by less than {pct:g} % over the last {n} evaluations "
    "({loss:.4f}); try a lower learning rate"
)
# An early stop none of the above explains: the loss fell, then bounced above its best.
STOPPED_EARLY_ADVICE = (
    "stopped early: validation loss stayed above its best ({best:.4f} at step {step}) for "
    "{n} evaluations ({last:.4f} at the last){falling}; a learning rate too high for the run "
    "bounces around its minimum: try {lower} (now {lr}), or a larger "
    "--early-stopping-patience if the loss was still falling slowly"
)
# An early stop whose last evaluation was its best: the loss still fell, by less than the
# least drop that counts as an improvement, for the whole patience. Lowering the rate would
# not help; letting the run go on would.
STILL_FALLING_ADVICE = (
    "stopped early while still improving: validation loss fell to {last:.4f} at step {step} "
    "(its best), but by less than --early-stopping-min-delta {min_delta:g} below {anchor:.4f} "
    "(step {anchor_step}) for {n} evaluations; a smaller --early-stopping-min-delta or a "
    "larger --early-stopping-patience lets it run its schedule"
)


@dataclass(frozen=True)
class Verdict:
    """What one evaluation means for early stopping."""

    improved: bool  # a new best: the run should keep a checkpoint of it
    stop: bool
    reason: str | None = None


@dataclass
class EarlyStopping:
    """Stops a run whose validation loss stopped improving; remembers the best evaluation.

    Args:
        patience: Evaluations without an improvement before the run stops.
        min_delta: The least drop below the best loss that counts as an improvement.
    """

    patience: int
    min_delta: float = 0.0
    best_loss: float | None = None
    best_step: int | None = None
    evals_without_improvement: int = 0

    def observe(self, step: int, loss: float) -> Verdict:
        """Record the validation loss of `step`."""
        if self.best_loss is None or loss < self.best_loss - self.min_delta:
            self.best_loss, self.best_step = loss, step
            self.evals_without_improvement = 0
            return Verdict(improved=True, stop=False)
        self.evals_without_improvement += 1
        if self.evals_without_improvement < self.patience:
            return Verdict(improved=False, stop=False)
        reason = (
            f"early stopping: validation loss has not improved by {self.min_delta:g} for "
            f"{self.evals_without_improvement} evaluations (best {self.best_loss:.4f} at step "
            f"{self.best_step})"
        )
        return Verdict(improved=False, stop=True, reason=reason)

    def replay(self, history: Sequence[Sequence[float]]) -> None:
        """Start over from `[step, loss]` evaluations (after a rollback dropped some)."""
        self.best_loss, self.best_step, self.evals_without_improvement = None, None, 0
        for step, loss in history:
            self.observe(int(step), float(loss))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def mean_train_loss(train_losses: Sequence[Sequence[float]], after: int, upto: int) -> float | None:
    """Mean training loss of the steps in (after, upto]; None when there are none."""
    values = [loss for step, loss in train_losses if after < step <= upto]
    return sum(values) / len(values) if values else None


def advise(
    evals: Sequence[tuple[int, float, float | None]],
    *,
    learning_rate: float | None = None,
    gave_up: str | None = None,
    stopped_early: bool = False,
    min_delta: float = 0.0,
    overfit_evals: int = OVERFIT_EVALS,
    plateau_evals: int = 4,
) -> list[str]:
    """One line for each problem the curves show: no learning, overfitting, a plateau; a run
    that early stopping ended always gets one (why it stopped, what to try).

    Args:
        evals: ``(step, validation loss, mean training loss since the previous evaluation)``
            per evaluation, oldest first.
        learning_rate: The run's learning rate, named (with a lower one) when the advice is
            about it.
        gave_up: Why recovery gave up (a non-finite loss or a divergence after its last
            rollback); the advice then says so and names the learning rate.
        stopped_early: Early stopping ended the run: where the curves show none of the
            problems above, the advice says it stopped and names the learning rate (or,
            where its last evaluation was its best, that it was still improving).
        min_delta: The run's `--early-stopping-min-delta`, named where it stopped a run
            that was still improving.
        overfit_evals: Overfitting: the best validation loss is at least this many
            evaluations old and the last one is above it, while the training loss kept
            falling (by more than `TRAIN_DROP` since the best).
        plateau_evals: Plateau: the last this many evaluations stayed within
            `PLATEAU_RELATIVE_CHANGE` of each other (and the run is not overfitting).
    """
    if gave_up is not None:
        lr, lower, _ = _rates(learning_rate)
        return [GAVE_UP_ADVICE.format(reason=gave_up.split(";")[0], lr=lr, lower=lower)]
    advice = _curve_advice(evals, learning_rate, overfit_evals, plateau_evals)
    if stopped_early and not advice and evals:
        return [_stopped_early(evals, learning_rate, min_delta)]
    return advice


def _curve_advice(
    evals: Sequence[tuple[int, float, float | None]],
    learning_rate: float | None,
    overfit_evals: int,
    plateau_evals: int,
) -> list[str]:
    """`advise`'s reading of the curves: not learning, overfitting, a plateau, or nothing."""
    stuck = _not_learning(evals, learning_rate)
    if stuck is not None:
        return [stuck]
    best = _overfitting(evals, overfit_evals)
    if best is not None:
        step, loss = best
        return [OVERFITTING_ADVICE.format(best=loss, step=step)]
    if len(evals) >= plateau_evals:
        recent = [v for _, v, _ in evals[-plateau_evals:]]
        if (max(recent) - min(recent)) / max(abs(min(recent)), 1e-12) < PLATEAU_RELATIVE_CHANGE:
            pct = 100 * PLATEAU_RELATIVE_CHANGE
            return [PLATEAU_ADVICE.format(pct=pct, n=plateau_evals, loss=recent[-1])]
    return []


def _stopped_early(
    evals: Sequence[tuple[int, float, float | None]],
    learning_rate: float | None,
    min_delta: float = 0.0,
) -> str:
    """The line for an early stop the curves explain no other way."""
    best = min(range(len(evals)), key=lambda i: evals[i][1])
    step, loss, _ = evals[best]
    if best == len(evals) - 1 and len(evals) > 1:  # still falling, by less than min_delta
        rule = EarlyStopping(patience=len(evals) + 1, min_delta=min_delta)
        rule.replay([(s, v) for s, v, _ in evals])
        return STILL_FALLING_ADVICE.format(
            last=loss, step=step, min_delta=min_delta, anchor=rule.best_loss,
            anchor_step=rule.best_step, n=rule.evals_without_improvement,
        )  # fmt: skip
    lr, lower, _ = _rates(learning_rate)
    first = evals[0][1]
    falling = f", {100 * (1 - loss / first):.1f} % below its first" if first > 0 else ""
    return STOPPED_EARLY_ADVICE.format(
        best=loss, step=step, n=len(evals) - 1 - best, last=evals[-1][1], falling=falling,
        lr=lr, lower=lower,
    )  # fmt: skip


def _rates(learning_rate: float | None) -> tuple[str, str, str]:
    """The run's learning rate, a lower and a higher one to try, as printed."""
    if learning_rate is None or not learning_rate > 0:
        return "in use", "a tenth of it", "ten times it"
    low, high = learning_rate / LR_STEP, learning_rate * LR_STEP
    return f"{learning_rate:g}", f"{low:.0e}", f"{high:.0e}"


def _not_learning(
    evals: Sequence[tuple[int, float, float | None]], learning_rate: float | None
) -> str | None:
    """The advice for a run whose losses never fell (or rose), else None.

    Validation never went `NOT_LEARNING_DROP` below its first evaluation, and the training
    loss did not fall by `TRAIN_DROP` either: a run whose training loss falls while its
    validation loss does not is overfitting, not stuck.
    """
    if len(evals) < NOT_LEARNING_EVALS:
        return None
    step, first, _ = evals[0]
    later = [v for _, v, _ in evals[1:]]
    if not all(math.isfinite(v) for v in later) or min(later) < first * (1 - NOT_LEARNING_DROP):
        return None
    trains = [t for _, _, t in evals if t is not None and math.isfinite(t)]
    if len(trains) >= 2 and trains[-1] < trains[0] * (1 - TRAIN_DROP):
        return None
    lr, lower, higher = _rates(learning_rate)
    last, steps = later[-1], int(evals[-1][0])
    values = dict(first=first, step=step, last=last, n=len(evals), lr=lr, lower=lower)
    flat = max(later + [first]) - min(later + [first]) < PLATEAU_RELATIVE_CHANGE * abs(first)
    if flat and learning_rate is not None and learning_rate * steps < TOO_LOW_TRAVEL:
        pct = 100 * PLATEAU_RELATIVE_CHANGE
        return NOT_MOVING_ADVICE.format(pct=pct, steps=steps, higher=higher, **values)
    if last > first * (1 + NOT_LEARNING_DROP) and all(b >= a for a, b in pairwise(later)):
        return DIVERGING_ADVICE.format(**values)
    return NOT_LEARNING_ADVICE.format(pct=100 * NOT_LEARNING_DROP, **values)


def _overfitting(
    evals: Sequence[tuple[int, float, float | None]], n: int
) -> tuple[int, float] | None:
    """The best evaluation (step, loss) when the curves show overfitting, else None."""
    if len(evals) < n + 1:
        return None
    best = min(range(len(evals)), key=lambda i: evals[i][1])
    best_step, best_val, best_train = evals[best]
    last_val, last_train = evals[-1][1], evals[-1][2]
    if len(evals) - 1 - best < n or last_val <= best_val * (1 + PLATEAU_RELATIVE_CHANGE):
        return None
    if best_train is None or last_train is None or last_train >= best_train * (1 - TRAIN_DROP):
        return None
    return best_step, best_val
