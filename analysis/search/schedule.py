"""The search's own cost, planned before its first trial: how many trials, at which fidelity.

A trial trains the first `fidelity` of its full run's data. Its time is what does not shrink
with the fidelity (start-up, its evaluations, one timed checkpoint save) plus the fidelity's
share of the full run's training. Given a budget of GPU-hours the plan keeps the trials the
user asked for and lowers their fidelity first (at 0.02 a study picked the same
configuration as at 0.1 for a fifth of the time, issue 24), down to the smallest trial whose
curve the loss law can still fit; only then does it drop trials. It lowers the fidelity for
at most `ENOUGH_TRIALS` trials: a budget that buys more runs more at the trial fraction.

Pure functions of the time model's estimates: `hpo` plans a study with them and
`analysis.plan` prints the same plan before anything is downloaded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from analysis.search.quality import expected_pick, pick_lines
from analysis.timemodel.model import Estimate
from common.checks import require
from common.errors import BadInputError
from common.fmt import format_hours

# Why 50 %: benchmarks/curve_replay.py on 200 recorded LoRA runs of a pre-trained model
# (docs/curve-replay.md): the default rungs scaled into half a full run of search picked a
# top-two configuration of 12 in 58 % of studies, into one full run 83 %, unscaled (1.48)
# 87 % (2026-11-29), the last rung alone at 0.4 full runs 49 % (2026-12-07); at a tenth of
# a full run no trial reaches the curves' first evaluation.
# Below an hour of full run the fixed costs of a trial (start-up, evaluations, a save) are
# minutes and would not fit in any share of it, so the default applies only from there; a
# flag always applies.
DEFAULT_SEARCH_BUDGET_PCT = 50.0
DEFAULT_BUDGET_FROM_HOURS = 1.0
# The lowest fidelity the loss-prediction benchmark measured (rank_fidelity: 0.01-0.1).
MIN_FIDELITY = 0.01
# The joint loss-law fit needs at least three points on a curve (analysis/curves/law.py).
MIN_FIT_EVALS = 3
# The fidelity is lowered to make room for the trials asked for, but not for more than this
# many: past it, longer trials are worth more than more of them (trials cut to the fidelity
# floor picked far worse full runs). 50 leaves TPE 40 trials past its 10 random ones
# (docs/notes/tuned-constants.md).
ENOUGH_TRIALS = 50
# Trials below this share of their run are short enough to misrank a long one, which
# promoting the best to a longer rung repairs (docs/notes/tuned-constants.md): the plan says
# so where no promotion is asked for (where one is asked and none fits, it says that instead).
SHORT_TRIALS = 0.05


# Successive halving in data fraction after trials at 0.02 of their run: the best 6 on to
# 0.12, the best 2 of those to 0.44 (the last rung scored by its loss one doubling on).
# benchmarks/curve_replay.py chose it on recorded real LoRA curves (docs/curve-replay.md).
DEFAULT_TRIAL_FRACTION = 0.02
DEFAULT_RUNGS = ("6@0.12", "2@0.44")
# The least a budget may shrink a first rung to, as a multiple of the trials' share: below
# it the rung adds too little data to rank by.
RUNG_STEP = 1.5


def parse_rungs(entries: tuple[str, ...], fraction: float) -> tuple[tuple[int, float], ...]:
    """`("6@0.12", "2@0.44")` -> ((6, 0.12), (2, 0.44)); `("none",)` or () -> ().

    Raises:
        BadInputError: An entry that is not K@F, a K below 1 or above the rung before's, or an
            F not above the trial fraction and the rung before's, or above 1.
    """
    if tuple(e.strip().lower() for e in entries) in ((), ("none",), ("",)):
        return ()
    rungs: list[tuple[int, float]] = []
    for entry in entries:
        keep, at, share = str(entry).partition("@")
        try:
            rung = (int(keep), float(share))
        except ValueError:
            rung = None
        if not at or rung is None:
            raise BadInputError(f"rungs: each must be K@F (for example 6@0.12), but got {entry!r}")
        before_keep, before = rungs[-1] if rungs else (rung[0], fraction)
        require(
            1 <= rung[0] <= before_keep and before < rung[1] <= 1,
            f"rungs: {entry!r} needs 1 <= K <= the rung before's K and F in "
            f"({before:g}, 1] (above trial_fraction and the rung before)",
        )
        rungs.append(rung)
    return tuple(rungs)


@dataclass(frozen=True)
class TrialCost:
    """One trial's predicted seconds: `fixed` + `per_fidelity` x its fidelity, and `once`.

    `once` is paid once per worker, not per trial: loading the base model (and the warm-up
    of its first steps) where a worker keeps it between trials. `fixed_source` says where
    `fixed` comes from: the time model's prior, or what this study's trials measured.
    """

    fixed: float
    per_fidelity: float
    once: float = 0.0
    fixed_source: str = "prior"

    def seconds(self, fidelity: float) -> float:
        return self.fixed + self.per_fidelity * fidelity

    def measured(self, fixed_seconds: float, trials: int) -> TrialCost:
        """The same cost with `fixed` measured on `trials` trials (their load included)."""
        return replace(
            self, fixed=fixed_seconds, once=0.0, fixed_source=f"measured on {trials} trials"
        )


def trial_cost(full_run: Estimate, *, evals: int, reuse_base_model: bool = False) -> TrialCost:
    """A trial of `full_run`'s configuration, from the time model's breakdown of the full run.

    The trial keeps the full run's start-up and warm-up (once per worker where it reuses its
    base model), evaluates `evals` times and saves one checkpoint (timed for the full run's
    saves); its training and data loading are the fidelity's share of the full run's. The
    breakdown is the median's, scaled to the p50.
    """
    parts = full_run.breakdown
    total = sum(parts.values()) or 1.0
    scale = full_run.seconds_p50 / total
    load = parts.get("startup", 0.0) + parts.get("warmup", 0.0)
    fixed = evals * full_run.extra.get("eval_seconds_each", 0.0) + full_run.extra.get(
        "checkpoint_seconds_each", 0.0
    )
    per_fidelity = parts.get("train", 0.0) + parts.get("data_loading", 0.0)
    return TrialCost(
        fixed=(fixed + (0.0 if reuse_base_model else load)) * scale,
        per_fidelity=per_fidelity * scale,
        once=load * scale if reuse_base_model else 0.0,
    )


@dataclass(frozen=True)
class SearchPlan:
    """What the search will spend, planned before its first trial.

    Attributes:
        budget_hours: GPU-hours the search may spend (all workers), None: no budget.
        source: Where the budget comes from, in words.
        trials: Trials planned.
        fidelity: Each trial's share of its full run.
        min_fidelity: The smallest share whose curve the loss law can fit.
        trial_hours: One trial's predicted GPU-hours at `fidelity`.
        before_trials_hours: GPU-hours already spent before the trials (each session's
            set-up to its first trial, a probe).
        full_run_hours_p50: The full run's predicted p50 in GPU-hours (its hours x
            `full_run_gpus`), for comparison.
        price_per_hour: The machine's price.
        workers: Processes sharing the budget (GPU-hours of all of them); wall-clock hours
            are about GPU-hours / workers.
        fixed_hours: The part of `trial_hours` that does not shrink with the fidelity.
        fixed_source: Where `fixed_hours` comes from (the prior, or measured trials).
        once_hours: Paid once per worker (loading the base model it keeps between trials).
        promote: Trials continued after the search, all rungs together (`--rungs`,
            `--promote`): fewer than asked where the budget holds fewer.
        promote_fraction: The last rung's share of the full run.
        promote_hours: GPU-hours kept for them (each continues from its last checkpoint:
            a trial's fixed cost and the fraction it adds): the trials are sized on the rest.
        promote_asked: The promotions asked for (`promote` is what the budget holds).
        rungs: The rungs the budget holds, (trials, share of the full run) each.
        rungs_asked: The rungs asked for.
        full_run_gpus: GPUs the full run trains on (its trials train on one).
    """

    budget_hours: float | None
    source: str
    trials: int
    fidelity: float
    min_fidelity: float
    trial_hours: float
    full_run_hours_p50: float
    price_per_hour: float = 0.0
    before_trials_hours: float = 0.0
    workers: int = 1
    fixed_hours: float = 0.0
    fixed_source: str = "prior"
    once_hours: float = 0.0
    promote: int = 0
    promote_fraction: float = 0.0
    promote_hours: float = 0.0
    promote_asked: int = 0
    rungs: tuple[tuple[int, float], ...] = ()
    rungs_asked: tuple[tuple[int, float], ...] = ()
    full_run_gpus: int = 1

    @property
    def planned_hours(self) -> float:
        return (
            self.before_trials_hours
            + self.workers * self.once_hours
            + self.trials * self.trial_hours
            + self.promote_hours
        )

    @property
    def default_shape(self) -> bool:
        """Whether its rungs are the default ones (scaled or not): what the replayed
        pick-by-budget curve (`analysis.search.quality`) measured."""
        default = parse_rungs(DEFAULT_RUNGS, DEFAULT_TRIAL_FRACTION)
        return bool(self.rungs) and tuple(map(tuple, self.rungs_asked)) == default

    @property
    def training_full_runs(self) -> float:
        """The search's training in full runs: the trials' shares and what each rung adds."""
        total, before = self.trials * self.fidelity, self.fidelity
        for keep, share in self.rungs:
            total, before = total + keep * max(share - before, 0.0), share
        return total

    @property
    def trials_per_worker(self) -> int:
        return math.ceil(self.trials / self.workers)

    def cost(self, hours: float) -> float:
        return hours * self.price_per_hour

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["planned_hours"] = self.planned_hours
        out["training_full_runs"] = self.training_full_runs
        out["expected_pick"] = expected_pick(self.training_full_runs, self.default_shape)
        out["planned_cost"] = self.cost(self.planned_hours)
        out["full_run_cost_p50"] = self.cost(self.full_run_hours_p50)
        return out

    def lines(self) -> list[str]:
        """The plan as the study and `analysis.plan` print it."""
        priced = self.price_per_hour > 0
        budget = (
            "no search budget"
            if self.budget_hours is None
            else f"search budget {format_hours(self.budget_hours)} of GPU time ({self.source})"
        )
        cost = f", cost {self.cost(self.planned_hours):.2f}" if priced else ""
        lines = [
            f"{budget}: planned {self.trials} trials at {self.fidelity:.3g} of their full run "
            f"(min {self.min_fidelity:.3g}), {format_hours(self.trial_hours)} each (fixed "
            f"{format_hours(self.fixed_hours)}: {self.fixed_source}), "
            f"{format_hours(self.planned_hours)} of GPU time in all{cost}",
        ]
        if self.workers > 1:
            lines.append(
                f"  {self.workers} workers share the budget (GPU-hours of all of them): about "
                f"{self.trials_per_worker} trials each, "
                f"{format_hours(self.planned_hours / self.workers)} of wall clock"
            )
        if self.promote:
            steps = ", then ".join(f"the {k} best to {f:.3g}" for k, f in self.rungs)
            lines.append(
                f"  then {steps} of their full run (--rungs): "
                f"{format_hours(self.promote_hours)} kept for them"
            )
        if self.rungs != self.rungs_asked:
            asked = ", then ".join(f"{k} to {f:.3g}" for k, f in self.rungs_asked)
            held = (
                "none of them" if not self.rungs
                else "them at shorter shares" if len(self.rungs) == len(self.rungs_asked)
                else "only its last rung, at a shorter share" if len(self.rungs) == 1
                else f"only its last {len(self.rungs)}, at shorter shares"
            )  # fmt: skip
            lines.append(
                f"  the rungs asked for ({asked}) do not fit the budget: it holds {held}; "
                "a larger --search-hours or --search-budget-pct holds more"
            )
        if self.once_hours > 0:
            lines.append(
                f"  loading the base model once per worker: {format_hours(self.once_hours)}"
            )
        if self.before_trials_hours > 0:
            lines.append(
                "  of which set-up and probe before the trials: "
                f"{format_hours(self.before_trials_hours)}"
            )
        lines.extend(pick_lines(self.training_full_runs, self.default_shape))
        full_cost = f", cost {self.cost(self.full_run_hours_p50):.2f}" if priced else ""
        gpus = self.full_run_gpus
        each = format_hours(self.full_run_hours_p50 / gpus)
        on = "" if gpus == 1 else f" of GPU time ({gpus} GPUs x {each})"
        lines.append(
            f"  full run for comparison: p50 {format_hours(self.full_run_hours_p50)}{on}{full_cost}"
        )
        if self.fidelity < SHORT_TRIALS and not self.promote_asked:
            lines.append(
                f"  trials at {self.fidelity:.3g} of their run may rank it poorly: at 1-3 % of "
                "844-3375-step runs the pick was not among the best 2 of 8 in 10 of 30 "
                "measured cases (rank_fidelity.py); rungs (--rungs 2@0.1: about a tenth "
                "of a full run more) picked among the best 2 in 29 of 30"
            )
        return lines


def budget_hours(
    *,
    search_hours: float | None,
    search_budget_pct: float | None,
    full_run_hours_p50: float,
) -> tuple[float | None, str]:
    """The search's GPU-hours and where they come from (the smaller where both are given)."""
    options: list[tuple[float, str]] = []
    if search_hours is not None:
        options.append((search_hours, f"--search-hours {search_hours:g}"))
    if search_budget_pct is not None:
        options.append(
            (
                search_budget_pct / 100 * full_run_hours_p50,
                f"{search_budget_pct:g} % of the full run's p50",
            )
        )
    if options:
        return min(options)
    if full_run_hours_p50 >= DEFAULT_BUDGET_FROM_HOURS:
        return (
            DEFAULT_SEARCH_BUDGET_PCT / 100 * full_run_hours_p50,
            f"default: {DEFAULT_SEARCH_BUDGET_PCT:g} % of the full run's p50",
        )
    return None, "none"


def plan_search(
    cost: TrialCost,
    *,
    budget_hours: float | None,
    source: str,
    n_trials: int,
    max_fidelity: float,
    full_run_steps: int,
    evals: int,
    full_run_hours_p50: float,
    price_per_hour: float = 0.0,
    before_trials_hours: float = 0.0,
    workers: int = 1,
    promote: int = 0,
    promote_fraction: float = 0.0,
    rungs: Sequence[tuple[int, float]] = (),
) -> SearchPlan:
    """Trials and fidelity that fit `budget_hours`: fidelity first, then fewer trials.

    The trials asked for are priced at their fraction first, and the rungs (`rungs` after
    the search, each promoted trial continuing from its last checkpoint: a trial's fixed cost
    plus the share it adds) scaled into the rest (`rungs_within`); the trials are then sized
    on what the rungs left.

    Args:
        cost: One trial's predicted seconds as a function of its fidelity.
        budget_hours: GPU-hours for the whole search, set-up and probe included; None: no
            budget (`n_trials` at `max_fidelity`).
        source: Where the budget comes from, in words.
        n_trials: Trials the user asked for (the most the plan makes).
        max_fidelity: The study's trial fraction (the largest share a trial trains).
        full_run_steps: Optimizer steps of the full run: a trial trains at least one step per
            evaluation, and at least `MIN_FIT_EVALS` evaluations.
        evals: Evaluations per trial.
        full_run_hours_p50: The full run's predicted p50.
        price_per_hour: The machine's price.
        before_trials_hours: Already spent before the trials (set-up, probe).
        workers: Processes sharing the budget.
        promote: One rung of this many trials (`--promote`; 0: none), where `rungs` is empty.
        promote_fraction: Its share of the full run.
        rungs: (trials, share of the full run) per rung, in order.
    """
    if not rungs and promote:
        rungs = ((promote, promote_fraction),)
    if n_trials < 1 or not 0 < max_fidelity <= 1 or full_run_steps < 1:
        raise BadInputError(
            f"a search plan needs n_trials >= 1, max_fidelity in (0, 1] and full_run_steps "
            f">= 1, but got {n_trials=}, {max_fidelity=}, {full_run_steps=}"
        )
    min_steps = max(MIN_FIT_EVALS, evals)
    min_fidelity = min(max_fidelity, max(MIN_FIDELITY, min_steps / full_run_steps))
    trials, fidelity = n_trials, max_fidelity
    held = tuple(rungs)
    if budget_hours is not None:
        left = max(0.0, (budget_hours - before_trials_hours) * 3600 - workers * cost.once)
        total = left
        # The trials the first rung halves at their fraction first, the rungs scaled into
        # the rest; the trials then sized on what the rungs leave.
        room = left - _halved_trials(rungs, n_trials) * cost.seconds(max_fidelity)
        held = rungs_within(cost, rungs, max_fidelity, room)
        left -= rungs_seconds(cost, held, max_fidelity)
        # The largest fidelity at which the trials asked for fit (at most ENOUGH_TRIALS of
        # them), within [min_fidelity, max_fidelity]; then as many as fit, up to n_trials.
        each = left / min(n_trials, ENOUGH_TRIALS)
        if cost.per_fidelity > 0:
            fidelity = (each - cost.fixed) / cost.per_fidelity
        fidelity = min(max_fidelity, max(min_fidelity, fidelity))
        if n_trials * cost.seconds(fidelity) > left * (1 + 1e-9):  # rounding: not a trial less
            trials = max(1, math.floor(left * (1 + 1e-9) / cost.seconds(fidelity)))
        if fidelity < max_fidelity and held:  # shorter trials: each first rung adds more
            spent = min(trials, n_trials) * cost.seconds(fidelity)
            held = rungs_within(cost, held, fidelity, total - spent)
    return SearchPlan(
        budget_hours=budget_hours,
        source=source,
        trials=min(trials, n_trials),
        fidelity=fidelity,
        min_fidelity=min_fidelity,
        trial_hours=cost.seconds(fidelity) / 3600,
        full_run_hours_p50=full_run_hours_p50,
        price_per_hour=price_per_hour,
        before_trials_hours=before_trials_hours,
        workers=workers,
        fixed_hours=cost.fixed / 3600,
        fixed_source=cost.fixed_source,
        once_hours=cost.once / 3600,
        promote=sum(k for k, _ in held),
        promote_fraction=held[-1][1] if held else 0.0,
        promote_hours=rungs_seconds(cost, held, fidelity) / 3600,
        promote_asked=sum(k for k, _ in rungs),
        rungs=held,
        rungs_asked=tuple(rungs),
    )


def rungs_seconds(cost: TrialCost, rungs: Sequence[tuple[int, float]], fidelity: float) -> float:
    """Seconds of `rungs` after trials at `fidelity`: each promoted trial pays a trial's
    fixed cost and the share it adds to the rung before's."""
    total, before = 0.0, fidelity
    for keep, share in rungs:
        total += keep * cost.seconds(max(share - before, 0.0))
        before = share
    return total


def _halved_trials(rungs: Sequence[tuple[int, float]], n_trials: int) -> int:
    """The trials a budget keeps room for before its rungs: twice the first rung's."""
    return min(n_trials, 2 * rungs[0][0]) if rungs else n_trials


def rungs_within(
    cost: TrialCost, rungs: Sequence[tuple[int, float]], fidelity: float, room: float
) -> tuple[tuple[int, float], ...]:
    """`rungs` after trials at `fidelity`, their shares scaled down by one factor (their
    trials kept) until they fit in `room` seconds. Where even the first rung at `RUNG_STEP`
    x the trials' share would not fit, the rungs after it alone, scaled the same way (the
    last rung alone last: the pick is the best of the furthest rung); () where not even that
    fits.

    Scaling keeps the schedule's shape: on recorded real LoRA curves (docs/curve-replay.md)
    the default rungs scaled into a third of their cost picked a top-two configuration in 58 %
    of replayed studies; in a first screen of the same curves fewer trials on the same rungs
    picked about 37 % at that cost. Below that the trials alone, ranked by their loss at
    their share, left the rest of the budget unspent (docs/curve-replay.md, "A budget too
    small for the rungs").
    """
    for first in range(len(rungs)):
        held = _scaled_into(cost, rungs[first:], fidelity, room)
        if held is not None:
            return held
    return ()


def _scaled_into(
    cost: TrialCost, rungs: Sequence[tuple[int, float]], fidelity: float, room: float
) -> tuple[tuple[int, float], ...] | None:
    """`rungs` scaled by the largest factor that fits `room` (themselves where they fit);
    None where the first at `RUNG_STEP` x `fidelity` would not."""
    if rungs_seconds(cost, rungs, fidelity) <= room * (1 + 1e-9):
        return tuple(rungs)
    lowest = RUNG_STEP * fidelity / rungs[0][1]

    def scaled(factor: float) -> tuple[tuple[int, float], ...]:
        return tuple((k, float(f"{f * factor:.3g}")) for k, f in rungs)

    if lowest >= 1 or rungs_seconds(cost, scaled(lowest), fidelity) > room:
        return None
    low, high = lowest, 1.0
    for _ in range(40):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if rungs_seconds(cost, scaled(middle), fidelity) <= room else (low, middle)
    return scaled(low)


def plan_search_for_run(
    full: Estimate,
    *,
    search_hours: float | None,
    search_budget_pct: float | None,
    n_trials: int,
    max_fidelity: float,
    evals: int,
    price_per_hour: float = 0.0,
    before_trials_hours: float = 0.0,
    workers: int = 1,
    reuse_base_model: bool = True,
    measured_fixed: tuple[float, int] | None = None,
    promote: int = 0,
    promote_fraction: float = 0.0,
    rungs: Sequence[tuple[int, float]] = (),
    one_gpu: Estimate | None = None,
) -> SearchPlan:
    """The search before the full run `full`: its budget (`budget_hours`), then `plan_search`.

    Args:
        full: The full run's prediction; on `full.gpus` GPUs its GPU-hours (what the budget
            is a percentage of, and what it costs) are that many times its hours.
        search_hours: GPU-hours the search may spend; None: not given.
        search_budget_pct: The search's GPU-hours as a % of the full run's p50; None: not
            given.
        n_trials: Trials asked for.
        max_fidelity: The largest share of its full run a trial trains.
        evals: Evaluations per trial.
        price_per_hour: The machine's price.
        before_trials_hours: Already spent before the trials (set-up, probe).
        workers: Processes sharing the budget.
        reuse_base_model: Each worker keeps its base model between trials (the study's
            default): the load is paid once per worker, not per trial.
        measured_fixed: A trial's fixed seconds as measured (by this machine's trials) and
            on how many trials; None: the time model's prior.
        promote: One rung of this many trials (`--promote`; 0: none), where `rungs` is empty.
        promote_fraction: Its share of the full run.
        rungs: (trials, share of the full run) per rung, in order.
        one_gpu: Where `full` trains on several GPUs: the same run on the trials' one GPU
            (the accumulation x its GPUs), whose share a trial trains.
    """
    hours = full.gpus * full.seconds_p50 / 3600
    cost = trial_cost(one_gpu or full, evals=evals, reuse_base_model=reuse_base_model)
    if measured_fixed is not None:
        cost = cost.measured(*measured_fixed)
    budget, source = budget_hours(
        search_hours=search_hours, search_budget_pct=search_budget_pct, full_run_hours_p50=hours
    )
    plan = plan_search(
        cost,
        budget_hours=budget,
        source=source,
        n_trials=n_trials,
        max_fidelity=max_fidelity,
        full_run_steps=full.optimizer_steps,
        evals=evals,
        full_run_hours_p50=hours,
        price_per_hour=price_per_hour,
        before_trials_hours=before_trials_hours,
        workers=workers,
        promote=promote,
        promote_fraction=promote_fraction,
        rungs=rungs,
    )
    return replace(plan, full_run_gpus=full.gpus)


def refit(plan: SearchPlan, cost: TrialCost, *, n_trials: int) -> SearchPlan:
    """`plan` at its fidelity (the study's trials compare at equal data) with a trial's cost
    as measured since: its trial hours, the promotions and the trials that now fit (at most
    `n_trials`)."""
    trials, held = n_trials, plan.rungs_asked
    if plan.budget_hours is not None:
        left = (plan.budget_hours - plan.before_trials_hours) * 3600 - plan.workers * cost.once
        room = left - _halved_trials(plan.rungs_asked, n_trials) * cost.seconds(plan.fidelity)
        held = rungs_within(cost, plan.rungs_asked, plan.fidelity, room)
        left -= rungs_seconds(cost, held, plan.fidelity)
        each = max(cost.seconds(plan.fidelity), 1e-9)
        trials = max(1, min(n_trials, math.floor(max(0.0, left) * (1 + 1e-9) / each)))
    return replace(
        plan,
        trials=trials,
        trial_hours=cost.seconds(plan.fidelity) / 3600,
        fixed_hours=cost.fixed / 3600,
        fixed_source=cost.fixed_source,
        once_hours=cost.once / 3600,
        promote=sum(k for k, _ in held),
        promote_fraction=held[-1][1] if held else 0.0,
        promote_hours=rungs_seconds(cost, held, plan.fidelity) / 3600,
        rungs=held,
    )
