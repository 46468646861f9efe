"""The study's own budget: planned before the first trial, kept during the study.

The plan (`analysis.search.schedule`) sizes the trials from the time model's prediction of a
typical feasible configuration, with a trial's fixed cost as this study's trials measured
it once there are some (refitted after every trial), the prior before. The ledger counts
from launch to exit: this session's own wall clock since its process started (set-up, a
probe, the gaps between trials), the other sessions' trials from Optuna's start and
completion stamps (running ones up to now, so all workers count) and what they spent
outside their trials (stored on the study). The work after the last trial (closing the
runs, the summary, the report, MLflow's finish) is reserved: a trial that would cross the
budget less that reserve stops at its next evaluation and is scored on what it has
(`BudgetStop`, a plain training callback); the study stops when what is left would not buy
half a trial (`BudgetKeeper.after_trial`). The reserve is the longest close a session of
this study measured, before any the smaller of this session's set-up and 5 % of the budget.

A full run on N GPUs (`budget.gpus_per_run`) is still searched on one: trials train on one GPU
(`hpo.trial_runs.on_one_gpu`), so the ledger's seconds are GPU-seconds as they are, a trial's
planned cost is a share of the full run's work on that one GPU, and a budget set as a
percentage is of the full run's GPU-hours (N x its hours: what it costs).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from analysis.search.schedule import SearchPlan, TrialCost, plan_search_for_run, refit, trial_cost
from analysis.timemodel.model import Estimate, predict
from common.mlflow_store import metric
from hpo.config import StudyConfig
from hpo.keys import (
    BEFORE_TRIALS_ATTR,
    ENDED_ATTR,
    NEVER_TRAINED_ATTR,
    PLAN_ATTR,
    STOPPED_ATTR,
    TAIL_ATTR,
)
from hpo.states import trials_snapshot
from trainers.events import EvalInfo, TrainingCallback

if TYPE_CHECKING:
    from hpo.estimator import StudyEstimator
    from hpo.tracking import Tracker

log = logging.getLogger(__name__)
ENDED_BY = ("search budget", "n_trials", "timeout", "nothing fits")
WORKERS_ENV = "HPO_WORKERS"  # set by `--workers N` for its workers: they share one budget
# The reserve for the close before any session measured it: at most this share of the budget.
TAIL_PRIOR_SHARE = 0.05
TYPICAL_SAMPLE = 32  # configurations judged for the plan's typical full run


def seconds_since_launch() -> float:
    """Seconds since this process started (its imports are search time too); 0 if unknown."""
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - no process table: count from the call
        return 0.0


def session_workers() -> int:
    """Workers sharing the study's budget: `--workers N` tells its workers through the env."""
    try:
        return max(1, int(os.environ.get(WORKERS_ENV, "1")))
    except ValueError:
        return 1


def measured_fixed(trials: Iterable[optuna.trial.FrozenTrial]) -> tuple[float, int] | None:
    """A trial's fixed seconds as this study's trained trials measured them, and how many.

    Per finished trial that trained: its wall time (Optuna's stamps: sampling, the checks,
    the trainer's set-up, evaluations, the timed save, tracking) less its optimizer steps'
    time. The median, so a worker's first trial (it loads the base model) weighs little.
    """
    fixed = [
        (t.datetime_complete - t.datetime_start).total_seconds()
        - float(t.user_attrs["steps_seconds"])
        for t in trials
        if t.datetime_start and t.datetime_complete and "steps_seconds" in t.user_attrs
    ]
    return (max(0.0, statistics.median(fixed)), len(fixed)) if fixed else None


def typical_runs(estimator: StudyEstimator) -> tuple[Estimate, Estimate | None]:
    """The full run of the space's typical configuration (the median feasible one by full-run
    p50), and, where it trains on several GPUs, the same run on the trials' one GPU
    (`hpo.trial_runs.on_one_gpu`): a trial's cost is a share of that; None on one GPU."""
    verdict, params = _typical(estimator)
    full = verdict.full_run
    if full.gpus == 1:
        return full, None
    _, own = estimator.specs(params)
    whole = dataclasses.replace(own, stop_after_steps=None)  # the trial, not cut short
    return full, predict(estimator.plan_of(whole), estimator.coefficients)


def _typical(estimator: StudyEstimator) -> tuple[Any, dict[str, Any]]:
    from hpo.what_fits import candidates

    config = estimator.config
    profiles = list(config.profiles or estimator.prepared.space.profiles)
    every = list(candidates(estimator.prepared.space, profiles))
    # An even sample of the space: a median needs no more, and each verdict is a prediction
    # (all 160 of the default space took 21 s of the set-up on the loaded 2-vCPU VM).
    step = max(1, len(every) // TYPICAL_SAMPLE)
    judged = [(estimator.verdict(p), p) for p in every[::step]]
    feasible = [pair for pair in judged if pair[0].feasible] or judged
    feasible.sort(key=lambda pair: pair[0].full_run.seconds_p50)
    return feasible[len(feasible) // 2]


def make_plan(
    config: StudyConfig,
    estimator: StudyEstimator,
    *,
    before_trials_seconds: float = 0.0,
    workers: int = 1,
    measured: tuple[float, int] | None = None,
    full: Any = None,
    one_gpu: Estimate | None = None,
) -> SearchPlan:
    """The study's search plan from its time model (before any trial; `measured`: a trial's
    fixed seconds as measured, see `measured_fixed`; `full`, `one_gpu`: `typical_runs`)."""
    if full is None:
        full, one_gpu = typical_runs(estimator)
    return plan_search_for_run(
        full,
        one_gpu=one_gpu,
        search_hours=config.budget.search_hours,
        search_budget_pct=config.budget.search_budget_pct,
        n_trials=config.n_trials,
        max_fidelity=config.trial.fraction,
        evals=config.trial.evals,
        price_per_hour=config.budget.price_per_hour,
        before_trials_hours=before_trials_seconds / 3600,
        workers=workers,
        reuse_base_model=config.reuse_base_model,
        measured_fixed=measured,
        rungs=config.trial.promotions,
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
    """Keeps one study inside its plan's budget from launch to exit; tells which limit ended it.

    Args:
        study: The study.
        plan: Its search plan.
        n_trials: Trials asked for (the most a refitted plan makes).
        cost: One trial's cost as planned from the time model, refitted to what the trials
            measure (None: the plan is not refitted).
        launched: This session's start on `clock` (its process's start where known).
        stored_seconds: What this session already added to the study's outside-trials
            seconds (its set-up; not counted twice).
    """

    def __init__(
        self,
        study: optuna.Study,
        plan: SearchPlan,
        *,
        n_trials: int | None = None,
        cost: TrialCost | None = None,
        launched: float | None = None,
        stored_seconds: float = 0.0,
        now: Callable[[], dt.datetime] = dt.datetime.now,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.study = study
        self.plan = plan
        self.opening = plan  # printed before the first trial: the summary's "at the start"
        self.n_trials = plan.trials if n_trials is None else n_trials
        self.cost = cost
        self.now = now
        self.clock = clock or time.perf_counter
        self.launched = self.clock() if launched is None else launched
        self.stored_seconds = stored_seconds
        attrs = study.user_attrs
        self.others_outside = float(attrs.get(BEFORE_TRIALS_ATTR, 0.0)) - stored_seconds
        tail = attrs.get(TAIL_ATTR)
        prior = min(stored_seconds, TAIL_PRIOR_SHARE * (self.budget_seconds or 0.0))
        self.reserve_seconds = prior if tail is None else float(tail)
        self.own: dict[int, float] = {}  # this session's finished trials: their seconds
        self.current: int | None = None  # this session's trial in training
        # On `clock`: this session's last trial ended. What follows it (the promotions' choice,
        # dropping the trials' checkpoints, the report) is the close its reserve keeps time for.
        self.trials_ended: float | None = None
        self.stopped = False
        # The search's trials are over and the promoted ones run: the plan's time kept for
        # them is theirs (`usable_seconds`).
        self.promoting = False
        # No configuration fits by the study's calibration any more (`hpo.runner`).
        self.nothing_fits = False
        self.first_session = True  # the study's first plan (its MLflow params are written once)
        # The summary `--workers N` writes once its workers are done (it runs no trial): the
        # limit that ended the study is the workers'.
        self.after_workers = False

    @property
    def budget_seconds(self) -> float | None:
        hours = self.plan.budget_hours
        return None if hours is None else hours * 3600

    @property
    def usable_seconds(self) -> float | None:
        """The budget less the reserve for the close after the last trial, and, until the
        promotions start (`promoting`), less the time the plan keeps for them."""
        budget = self.budget_seconds
        if budget is None:
            return None
        kept = 0.0 if self.promoting else self.plan.promote_hours * 3600
        return budget - self.reserve_seconds - kept

    def spent(self, trials: list[optuna.trial.FrozenTrial] | None = None) -> float:
        """GPU-seconds spent: this session's wall clock since launch, the other sessions'
        trials (running ones up to now) and their time outside trials (`trials`: the
        study's trials just read, else read now)."""
        if trials is None:
            trials = self.study.get_trials(deepcopy=False)
        others = [t for t in trials if t.number not in self.own and t.number != self.current]
        own = self.clock() - self.launched
        return own + self.others_outside + spent_seconds(others, now=self.now())

    def trial_callbacks(self, trial: optuna.Trial) -> list[TrainingCallback]:
        """The stop at the budget for one trial's run (none without a budget)."""
        self.current = trial.number
        usable = self.usable_seconds
        if usable is None:
            return []

        def mark() -> None:
            trial.set_user_attr(STOPPED_ATTR, "search budget")

        return [BudgetStop(self.spent, usable, clock=self.clock, on_stop=mark)]

    def record(self, _study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """Optuna callback: a trial of this session is over (the ledger counts it once)."""
        if trial.datetime_start and trial.datetime_complete:
            self.own[trial.number] = (
                trial.datetime_complete - trial.datetime_start
            ).total_seconds()
        self.current = None
        self.trials_ended = self.clock()

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """Optuna callback: refit the plan to what the trials measured; stop the study when
        the rest would not buy half a typical trial."""
        self.record(study, trial)
        trials = trials_snapshot(study)
        measured = measured_fixed(trials)
        if measured is not None and self.cost is not None:
            self.plan = refit(self.plan, self.cost.measured(*measured), n_trials=self.n_trials)
        usable = self.usable_seconds
        left = None if usable is None else usable - self.spent(trials)
        if left is not None and left < 0.5 * self.typical_trial_seconds(trials):
            self.stopped = True
            study.stop()

    def before_start(self) -> bool:
        """Whether any budget is left for a first trial of this session."""
        usable = self.usable_seconds
        if usable is None or usable - self.spent() >= 0.5 * self.typical_trial_seconds():
            return True
        self.stopped = True
        return False

    def typical_trial_seconds(self, trials: list[optuna.trial.FrozenTrial] | None = None) -> float:
        """The median trained trial's wall time so far, else the plan's prediction."""
        if trials is None:
            trials = self.study.get_trials(deepcopy=False)
        done = [
            (t.datetime_complete - t.datetime_start).total_seconds()
            for t in trials
            if t.datetime_start and t.datetime_complete and not t.user_attrs.get(NEVER_TRAINED_ATTR)
        ]
        return statistics.median(done) if done else self.plan.trial_hours * 3600

    def ended_by(self, finished: int, n_trials: int) -> str:
        """Which limit ended the study: search budget, nothing fits, n_trials or timeout."""
        if self.after_workers and self.study.user_attrs.get(ENDED_ATTR) in ENDED_BY:
            return str(self.study.user_attrs[ENDED_ATTR])
        if self.stopped:
            return "search budget"
        if self.nothing_fits:
            return "nothing fits"
        return "n_trials" if finished >= n_trials else "timeout"

    def report(self, ended_by: str) -> dict[str, Any]:
        """Planned against spent (up to now), for the summary and --json."""
        spent = self.spent() / 3600
        budget = self.plan.budget_hours
        return {
            **self.plan.to_dict(),
            "spent_hours": spent,
            "spent_cost": self.plan.cost(spent),
            "spent_over_budget": None if not budget else spent / budget,
            "ended_by": ended_by,
            "reserve_seconds": self.reserve_seconds,
            # What was printed before the first trial, against the plan refitted since.
            "opening": self.opening.to_dict(),
        }

    def finish(self, report: dict[str, Any]) -> dict[str, Any]:
        """At the session's exit: `report` with what it spent up to now, and on the study
        this session's time outside its trials and its close (the next session's reserve)."""
        final = {**report, **self.report(report["ended_by"])}
        outside = self.clock() - self.launched - sum(self.own.values())
        attrs = self.study.user_attrs
        before = float(attrs.get(BEFORE_TRIALS_ATTR, 0.0))
        self.study.set_user_attr(
            BEFORE_TRIALS_ATTR, before + max(0.0, outside - self.stored_seconds)
        )
        self.stored_seconds = max(self.stored_seconds, outside)
        self.study.set_user_attr(ENDED_ATTR, final["ended_by"])
        if self.trials_ended is not None:
            tail = self.clock() - self.trials_ended
            final["tail_seconds"] = tail
            self.study.set_user_attr(TAIL_ATTR, max(tail, float(attrs.get(TAIL_ATTR) or 0.0)))
        return final


def start(
    study: optuna.Study,
    config: StudyConfig,
    estimator: StudyEstimator,
    *,
    before_trials_seconds: float,
    launched: float | None = None,
) -> tuple[BudgetKeeper, StudyConfig]:
    """Plan the search (or take the plan a first session stored) and the config it runs.

    The trials of one study are compared at equal data, so a resumed study keeps the
    fidelity its first budgeted session planned (its trials refitted to what its trials
    measured). This session's seconds before its first trial (launch, set-up, a probe) are
    added to the study's ledger; `launched` is the session's start on `time.perf_counter`.
    """
    if before_trials_seconds > 0:
        before = float(study.user_attrs.get(BEFORE_TRIALS_ATTR, 0.0))
        study.set_user_attr(BEFORE_TRIALS_ATTR, before + before_trials_seconds)
    spent_before = float(study.user_attrs.get(BEFORE_TRIALS_ATTR, 0.0))
    full, one_gpu = typical_runs(estimator)
    measured = measured_fixed(study.get_trials(deepcopy=False))
    plan = make_plan(
        config,
        estimator,
        before_trials_seconds=spent_before,
        workers=session_workers(),
        measured=measured,
        full=full,
        one_gpu=one_gpu,
    )
    cost = trial_cost(
        one_gpu or full, evals=config.trial.evals, reuse_base_model=config.reuse_base_model
    )
    stored = study.user_attrs.get(PLAN_ATTR)
    if stored and stored.get("budget_hours") is not None and plan.budget_hours is not None:
        plan = dataclasses.replace(plan, fidelity=float(stored["fidelity"]))
        plan = refit(plan, cost.measured(*measured) if measured else cost, n_trials=config.n_trials)
    elif not stored:
        study.set_user_attr(PLAN_ATTR, plan.to_dict())
    keeper = BudgetKeeper(
        study,
        plan,
        n_trials=config.n_trials,
        cost=cost,
        launched=launched,
        stored_seconds=max(0.0, before_trials_seconds),
    )
    keeper.first_session = not stored
    if plan.fidelity != config.trial.fraction:
        trial = dataclasses.replace(config.trial, fraction=plan.fidelity)
        config = dataclasses.replace(config, trial=trial)
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


def rewrite_report_line(
    tracker: Tracker, parent: str, report: Path, before: dict[str, Any], final: dict[str, Any]
) -> None:
    """The study report's search line with the final spend (the report is drawn before the
    close ends), in the work dir's copy and the parent run's."""
    from analysis.report.document import search_line

    old, new = search_line(before), search_line(final)
    if old is None or new is None or not report.is_file():
        return
    text = report.read_text(encoding="utf-8")
    if old not in text:
        return
    report.write_text(text.replace(old, new), encoding="utf-8")
    tracker.log_artifact(parent, report, "report")
