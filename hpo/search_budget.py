"""The study's own budget: planned before the first trial, kept during the study.

The plan (`analysis.search_plan`) sizes the trials from the time model's prediction of a
typical feasible configuration. The ledger is the study's storage: every trial's wall time
from Optuna's start and completion stamps (running trials up to now, so all workers count)
plus what each session spent before its first trial (set-up, a probe: the GPU is rented
then too). A trial that would cross the budget stops at its next
evaluation and is scored on what it has (`BudgetStop`, a plain training callback); the
study stops when what is left would not buy half a trial (`BudgetKeeper.after_trial`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import statistics
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import optuna

from analysis.search_plan import SearchPlan, plan_search_for_run
from common.mlflow_store import metric
from hpo.config import StudyConfig
from trainers.events import EvalInfo, TrainingCallback

if TYPE_CHECKING:
    from hpo.estimator import StudyEstimator
    from hpo.tracking import Tracker

log = logging.getLogger(__name__)
PLAN_ATTR = "search_plan"  # on the study: the plan its first session made (fidelity kept)
# On the study: seconds its sessions spent before their first trial (set-up, probe).
BEFORE_TRIALS_ATTR = "search_before_trials_seconds"
STOPPED_ATTR = "stopped_by"  # on a trial the budget cut short
ENDED_BY = ("search budget", "n_trials", "timeout")


def typical_full_run(estimator: StudyEstimator) -> Any:
    """The verdict of the median feasible configuration (by full-run p50) of the space."""
    from hpo.what_fits import candidates

    config = estimator.config
    profiles = list(config.profiles or estimator.prepared.space.profiles)
    verdicts = [estimator.verdict(p) for p in candidates(estimator.prepared.space, profiles)]
    feasible = [v for v in verdicts if v.feasible] or verdicts
    feasible.sort(key=lambda v: v.full_run.seconds_p50)
    return feasible[len(feasible) // 2]


def make_plan(
    config: StudyConfig,
    estimator: StudyEstimator,
    *,
    before_trials_seconds: float = 0.0,
    workers: int = 1,
) -> SearchPlan:
    """The study's search plan from its time model (before any trial)."""
    return plan_search_for_run(
        typical_full_run(estimator).full_run,
        search_hours=config.budget.search_hours,
        search_budget_pct=config.budget.search_budget_pct,
        n_trials=config.n_trials,
        max_fidelity=config.trial.fraction,
        evals=config.trial.evals,
        price_per_hour=config.budget.price_per_hour,
        before_trials_hours=before_trials_seconds / 3600,
        workers=workers,
    )


def spent_seconds(
    trials: Iterable[optuna.trial.FrozenTrial],
    *,
    now: dt.datetime,
    before_trials_seconds: float = 0.0,
) -> float:
    """GPU-seconds the study has spent: its trials' wall time (running ones up to `now`)."""
    total = before_trials_seconds
    for trial in trials:
        if trial.datetime_start is None:
            continue
        end = trial.datetime_complete or now
        total += max(0.0, (end - trial.datetime_start).total_seconds())
    return total


class BudgetStop(TrainingCallback):
    """Stops a trial at the evaluation nearest to where the study's budget runs out.

    At each evaluation it asks how much the study has spent (`spent`, all workers); when the
    next evaluation interval would end more than halfway past the budget, the run stops here
    and the trial is scored on the points it has.
    """

    def __init__(
        self,
        spent: Callable[[], float],
        budget_seconds: float,
        *,
        clock: Callable[[], float],
        on_stop: Callable[[], None] = lambda: None,
    ) -> None:
        self.spent = spent
        self.budget_seconds = budget_seconds
        self.clock = clock
        self.on_stop = on_stop
        self.last = clock()
        self.stopped = False

    def on_eval(self, info: EvalInfo) -> bool:
        now = self.clock()
        interval, self.last = now - self.last, now
        if self.spent() + 0.5 * interval < self.budget_seconds:
            return False
        self.stopped = True
        self.on_stop()
        return True


class BudgetKeeper:
    """Keeps one study inside its plan's budget; tells which limit ended it."""

    def __init__(
        self,
        study: optuna.Study,
        plan: SearchPlan,
        *,
        now: Callable[[], dt.datetime] = dt.datetime.now,
        clock: Callable[[], float] | None = None,
    ) -> None:
        import time

        self.study = study
        self.plan = plan
        self.now = now
        self.clock = clock or time.perf_counter
        self.stopped = False
        self.first_session = True  # the study's first plan (its MLflow params are written once)

    @property
    def budget_seconds(self) -> float | None:
        hours = self.plan.budget_hours
        return None if hours is None else hours * 3600

    def spent(self) -> float:
        before = float(self.study.user_attrs.get(BEFORE_TRIALS_ATTR, 0.0))
        trials = self.study.get_trials(deepcopy=False)
        return spent_seconds(trials, now=self.now(), before_trials_seconds=before)

    def trial_callbacks(self, trial: optuna.Trial) -> list[TrainingCallback]:
        """The stop at the budget for one trial's run (none without a budget)."""
        budget = self.budget_seconds
        if budget is None:
            return []

        def mark() -> None:
            trial.set_user_attr(STOPPED_ATTR, "search budget")

        return [BudgetStop(self.spent, budget, clock=self.clock, on_stop=mark)]

    def after_trial(self, study: optuna.Study, _trial: optuna.trial.FrozenTrial) -> None:
        """Optuna callback: stop the study when the rest would not buy half a typical trial."""
        budget = self.budget_seconds
        if budget is None:
            return
        if budget - self.spent() < 0.5 * self.typical_trial_seconds():
            self.stopped = True
            study.stop()

    def before_start(self) -> bool:
        """Whether any budget is left for a first trial of this session."""
        budget = self.budget_seconds
        if budget is None or budget - self.spent() >= 0.5 * self.typical_trial_seconds():
            return True
        self.stopped = True
        return False

    def typical_trial_seconds(self) -> float:
        """The median trained trial's wall time so far, else the plan's prediction."""
        done = [
            (t.datetime_complete - t.datetime_start).total_seconds()
            for t in self.study.get_trials(deepcopy=False)
            if t.datetime_start and t.datetime_complete and not t.user_attrs.get("never_trained")
        ]
        return statistics.median(done) if done else self.plan.trial_hours * 3600

    def ended_by(self, finished: int, n_trials: int) -> str:
        """Which limit ended the study: search budget, n_trials or timeout."""
        if self.stopped:
            return "search budget"
        return "n_trials" if finished >= n_trials else "timeout"

    def report(self, ended_by: str) -> dict[str, Any]:
        """Planned against spent, for the summary and --json."""
        spent = self.spent() / 3600
        budget = self.plan.budget_hours
        return {
            **self.plan.to_dict(),
            "spent_hours": spent,
            "spent_cost": self.plan.cost(spent),
            "spent_over_budget": None if not budget else spent / budget,
            "ended_by": ended_by,
        }


def start(
    study: optuna.Study,
    config: StudyConfig,
    estimator: StudyEstimator,
    *,
    before_trials_seconds: float,
) -> tuple[BudgetKeeper, StudyConfig]:
    """Plan the search (or take the plan a first session stored) and the config it runs.

    The trials of one study are compared at equal data, so a resumed study keeps the
    fidelity its first budgeted session planned. This session's seconds before its first
    trial (set-up, a probe) are added to the study's ledger.
    """
    if before_trials_seconds > 0:
        before = float(study.user_attrs.get(BEFORE_TRIALS_ATTR, 0.0))
        study.set_user_attr(BEFORE_TRIALS_ATTR, before + before_trials_seconds)
    spent_before = float(study.user_attrs.get(BEFORE_TRIALS_ATTR, 0.0))
    plan = make_plan(config, estimator, before_trials_seconds=spent_before)
    stored = study.user_attrs.get(PLAN_ATTR)
    if stored and stored.get("budget_hours") is not None and plan.budget_hours is not None:
        plan = dataclasses.replace(plan, fidelity=float(stored["fidelity"]))
    elif not stored:
        study.set_user_attr(PLAN_ATTR, plan.to_dict())
    keeper = BudgetKeeper(study, plan)
    keeper.first_session = not stored
    if plan.fidelity != config.trial.fraction:
        trial = dataclasses.replace(config.trial, fraction=plan.fidelity)
        config = dataclasses.replace(config, trial=trial)
        estimator.config = config
    for line in plan.lines():
        print(line, flush=True)
    return keeper, config


def record_plan(tracker: Tracker, parent: str, keeper: BudgetKeeper) -> None:
    """The plan on the study's parent run (through the one writer).

    The first session's plan as params (MLflow params cannot change, and a resumed study's
    plan differs: the time model has learnt); every session's as the `search_plan` tag.
    """
    values = keeper.plan.to_dict()
    params = {f"search_plan.{k}": v for k, v in values.items() if v is not None}
    tracker.writer.log_batch(
        parent,
        params=params if keeper.first_session else None,
        tags={"search_plan": " ".join(keeper.plan.lines())},
    )


def record_spent(tracker: Tracker, parent: str, report: dict[str, Any]) -> None:
    """Planned against spent on the parent run: metrics and the limit that ended it."""
    metrics = [
        metric(f"search_{key}", report[key], 0)
        for key in ("planned_hours", "spent_hours", "planned_cost", "spent_cost")
    ]
    if report.get("spent_over_budget") is not None:
        metrics.append(metric("search_spent_over_budget", report["spent_over_budget"], 0))
    tracker.writer.log_batch(parent, metrics=metrics, tags={"search_ended_by": report["ended_by"]})
