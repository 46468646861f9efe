"""The search budget: planned before the first trial (analysis.search.schedule), kept during the
study (hpo.search_budget): a trial that would cross it stops at its next evaluation, the study
ends when it is spent whatever n_trials says, and the parent MLflow run records plan and spend.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import optuna
import pytest

from analysis.search.schedule import (
    DEFAULT_SEARCH_BUDGET_PCT,
    ENOUGH_TRIALS,
    MIN_FIDELITY,
    SHORT_TRIALS,
    TrialCost,
    budget_hours,
    plan_search,
    refit,
    trial_cost,
)
from analysis.timemodel.model import predict
from common.fmt import format_hours
from hpo.config import load_config
from hpo.estimator import StudyEstimator
from hpo.keys import BEFORE_TRIALS_ATTR, ENDED_ATTR, TAIL_ATTR
from hpo.prepare import prepare
from hpo.runner import run_study
from hpo.search_budget import BudgetKeeper, BudgetStop, make_plan, measured_fixed, spent_seconds
from hpo.summary import print_summary
from tests.cli import run_module
from tests.configs import demo_spec, short_study
from tests.test_timemodel import coefficients
from tests.test_timemodel import plan as timed_plan
from trainers.events import EvalInfo
from trainers.loop.run import train
from trainers.spec import LoraSpec

FAST_PRIOR = lambda: 1e10  # noqa: E731  (the priors' CPU probe: no timing in tests)


# -- the plan (pure) --------------------------------------------------------------------------
def _plan(cost: TrialCost, budget: float | None, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "budget_hours": budget,
        "source": "test",
        "n_trials": 10,
        "max_fidelity": 0.1,
        "full_run_steps": 10_000,
        "evals": 6,
        "full_run_hours_p50": 20.0,
    }
    values.update(overrides)
    return plan_search(cost, **values)


# A trial of a 20 h run: 0.1 h fixed, the rest in proportion to its fidelity.
COST = TrialCost(fixed=360.0, per_fidelity=20 * 3600.0)


def test_without_a_budget_the_plan_is_the_asked_trials_at_the_trial_fraction() -> None:
    plan = _plan(COST, None)
    assert (plan.trials, plan.fidelity) == (10, 0.1)
    assert plan.planned_hours == pytest.approx(10 * (0.1 + 2.0))


@pytest.mark.parametrize("budget", [4.0, 8.0, 18.0])
def test_a_budget_lowers_the_fidelity_first_and_keeps_the_trials(budget: float) -> None:
    plan = _plan(COST, budget)
    assert plan.trials == 10
    assert MIN_FIDELITY <= plan.fidelity < 0.1
    assert plan.planned_hours <= budget * 1.000001
    assert plan.planned_hours >= 0.99 * budget  # the budget is used, not left idle


def test_a_budget_lowers_the_fidelity_for_enough_trials_not_for_every_trial_asked() -> None:
    # `--n-trials` large: "as many as the budget buys". A trial at 0.1 costs 2.1 h.
    roomy = _plan(COST, 200.0, n_trials=100_000)
    assert roomy.fidelity == 0.1  # 95 trials fit at the trial fraction: it stays
    assert roomy.trials == 95
    tight = _plan(COST, 42.0, n_trials=100_000)  # 20 at 0.1: lowered until 50 fit, not 100 000
    assert MIN_FIDELITY < tight.fidelity < 0.1
    assert tight.trials == ENOUGH_TRIALS
    assert tight.planned_hours == pytest.approx(42.0, rel=1e-6)
    # Asked for fewer than that, the plan makes room for exactly those.
    few = _plan(COST, 42.0, n_trials=30)
    assert few.trials == 30 and tight.fidelity < few.fidelity < 0.1


def test_a_budget_below_the_smallest_trials_drops_trials_not_fidelity() -> None:
    plan = _plan(COST, 1.0)  # a trial at 0.01 costs 0.1 + 0.2 h: three fit
    assert plan.fidelity == MIN_FIDELITY
    assert plan.trials == 3
    assert plan.planned_hours <= 1.0


def test_the_smallest_trial_leaves_the_curve_fit_its_evaluations() -> None:
    plan = _plan(COST, 0.01, full_run_steps=200, evals=6)  # 6 steps of 200 > 1 %
    assert plan.min_fidelity == pytest.approx(6 / 200)
    assert plan.fidelity >= plan.min_fidelity
    assert plan.trials == 1  # a budget smaller than one trial still gets one, cut short


def test_what_was_spent_before_the_trials_comes_off_the_budget() -> None:
    with_probe = _plan(COST, 5.0, before_trials_hours=2.0)
    without = _plan(COST, 5.0)
    assert with_probe.planned_hours <= 5.0 * 1.000001
    assert with_probe.fidelity < without.fidelity


def test_a_worker_that_keeps_its_base_model_loads_it_once_not_per_trial() -> None:
    full = predict(timed_plan(eval_interval_steps=10), coefficients())
    fresh = trial_cost(full, evals=6, reuse_base_model=False)
    kept = trial_cost(full, evals=6, reuse_base_model=True)
    load = full.breakdown["startup"] + full.breakdown["warmup"]
    assert kept.once > 0 and kept.fixed < fresh.fixed
    assert kept.fixed + kept.once == pytest.approx(fresh.fixed)
    assert load > 0
    # The load comes off the budget once per worker, and trials are more than without reuse.
    one = _plan(kept, 1.0, full_run_steps=full.optimizer_steps)
    four = _plan(kept, 1.0, full_run_steps=full.optimizer_steps, workers=4)
    assert four.planned_hours == pytest.approx(one.planned_hours + 3 * kept.once / 3600, rel=0.05)


def test_the_fixed_cost_comes_from_the_measured_trials_once_there_are_some() -> None:
    t0 = dt.datetime(2026, 1, 1, 12, 0, 0)
    trials = [_frozen(n, t0, wall, steps_seconds=0.5) for n, wall in enumerate((9.0, 1.5, 1.7))]
    assert measured_fixed([_frozen(0, t0, 3.0)]) is None  # not trained: nothing measured
    fixed, n = measured_fixed(trials) or (0.0, 0)
    assert (fixed, n) == (pytest.approx(1.2), 3)  # the median: the first (loading) weighs little
    prior = _plan(COST, 4.0, n_trials=400)
    refitted = refit(prior, COST.measured(fixed, n), n_trials=400)
    assert refitted.fidelity == prior.fidelity  # the study compares its trials at equal data
    assert refitted.trials > prior.trials and refitted.fixed_source == "measured on 3 trials"
    assert refitted.planned_hours <= 4.0 * 1.000001


def test_the_rungs_are_scaled_into_what_the_trials_at_their_fraction_leave() -> None:
    # --promote 2 at 0.3: each continues its trial, a trial's fixed cost and the share it
    # adds: 2 x (0.1 h + 20 h x 0.2) = 8.2 h. Of 30 h, the 4 trials the rung halves at 0.1
    # leave 21.6: it fits, and the 10 trials at 0.1 (21 h) fit in the other 21.8 h.
    plan = _plan(COST, 30.0, promote=2, promote_fraction=0.3)
    assert plan.rungs == ((2, 0.3),) and plan.promote_hours == pytest.approx(8.2)
    assert (plan.trials, plan.fidelity) == (10, 0.1)
    assert plan.planned_hours == pytest.approx(29.2)
    assert "then the 2 best to 0.3 of their full run (--rungs): 8.2 h" in "\n".join(plan.lines())
    # Of 15 h they leave 6.6: the rung moves down to what fits, its 2 trials kept; the
    # trials then go below 0.1, and the rung is priced again from their share.
    tight = _plan(COST, 15.0, promote=2, promote_fraction=0.3)
    ((keep, share),) = tight.rungs
    assert keep == 2 and tight.fidelity * 1.5 <= share < 0.3 and tight.trials == 10
    assert tight.fidelity < 0.1
    assert tight.promote_hours == pytest.approx(2 * (0.1 + 20 * (share - tight.fidelity)))
    assert tight.planned_hours <= 15.0 * 1.000001
    assert "it holds them at shorter shares" in "\n".join(tight.lines())
    # The measured trial cost refits the trials and the rungs around the same budget.
    refitted = refit(plan, COST.measured(36.0, 3), n_trials=10)
    assert refitted.promote == 2 and refitted.planned_hours <= 30.0 * 1.000001
    # Without a budget they are planned GPU time all the same, from the trials' 0.1.
    assert _plan(COST, None, promote=2, promote_fraction=0.3).planned_hours == pytest.approx(
        10 * 2.1 + 2 * (0.1 + 20 * 0.2)
    )
    # Rungs: each promoted trial pays the share it adds to the rung before's.
    rungs = _plan(COST, None, rungs=((4, 0.2), (2, 0.5)))
    assert rungs.promote == 6 and rungs.rungs == ((4, 0.2), (2, 0.5))
    assert rungs.promote_hours == pytest.approx(4 * (0.1 + 20 * 0.1) + 2 * (0.1 + 20 * 0.3))
    text = "\n".join(rungs.lines())
    assert "then the 4 best to 0.2, then the 2 best to 0.5 of their full run" in text


def test_a_budget_scales_all_rungs_by_one_factor_then_keeps_the_last_alone_or_drops_them() -> None:
    # 4 at 0.2 then 2 at 0.5 would take 4 x 2.1 + 2 x 6.1 = 20.6 h; 32 h less the 8 trials
    # the first rung halves (16.8 h) leaves 15.2.
    plan = _plan(COST, 32.0, rungs=((4, 0.2), (2, 0.5)))
    assert [k for k, _ in plan.rungs] == [4, 2] and plan.promote_asked == 6
    (_, low), (_, high) = plan.rungs
    assert low < 0.2 and high / low == pytest.approx(2.5, rel=0.01)
    assert plan.promote_hours <= 15.2 * 1.000001 and plan.planned_hours <= 32.0 * 1.000001
    # 26 h leaves 9.2 h: not even the rungs with the first at 1.5 x the trials' share
    # (0.15, then 0.375: 13.6 h) fit; the last rung alone does (at 0.15 it takes 2.2 h), as
    # far as the rest holds, rather than leaving it unspent (the trials then take what the
    # rung leaves, at a share under 0.1, and the rung is priced again from theirs).
    last = _plan(COST, 26.0, rungs=((4, 0.2), (2, 0.5)))
    ((keep, share),) = last.rungs
    assert keep == 2 and 1.5 * last.fidelity <= share < 0.5 and last.promote == 2
    assert last.promote_hours > 2.2 and last.planned_hours == pytest.approx(26.0, rel=0.01)
    assert "it holds only its last rung, at a shorter share" in "\n".join(last.lines())
    # 18 h leaves 1.2 h after the 8 trials: not even the last rung at 0.15 fits.
    none = _plan(COST, 18.0, rungs=((4, 0.2), (2, 0.5)))
    assert none.rungs == () and none.promote == 0
    assert "it holds none of them" in "\n".join(none.lines())
    # Trials that alone take more than the budget leave the rungs nothing.
    assert _plan(COST, 8.0, promote=2, promote_fraction=0.3).promote == 0


def test_a_plan_of_short_trials_says_they_may_misrank_unless_it_promotes() -> None:
    short = _plan(COST, 4.0)  # 0.4 h a trial: 1.5 % of the run
    assert short.fidelity < SHORT_TRIALS
    assert "may rank it poorly" in short.lines()[-1] and "--rungs 2@0.1" in short.lines()[-1]
    promoting = _plan(COST, 12.0, max_fidelity=0.03, promote=1, promote_fraction=0.1)
    assert promoting.promote == 1 and promoting.fidelity < SHORT_TRIALS
    assert not any("may rank it poorly" in line for line in promoting.lines())
    assert not any("may rank it poorly" in line for line in _plan(COST, None).lines())


def test_the_trials_leave_the_promotions_their_time_until_these_start() -> None:
    plan = _plan(COST, 30.0, promote=2, promote_fraction=0.3)
    keeper = BudgetKeeper(optuna.create_study(), plan, launched=0.0, clock=Clock())
    keeper.reserve_seconds = 0.0
    assert keeper.usable_seconds == pytest.approx((30.0 - plan.promote_hours) * 3600)
    keeper.promoting = True
    assert keeper.usable_seconds == pytest.approx(30.0 * 3600)


def test_with_several_workers_the_plan_says_gpu_hours_of_all_and_trials_per_worker() -> None:
    plan = _plan(COST, 8.0, workers=4)
    text = "\n".join(plan.lines())
    assert plan.trials_per_worker == 3  # 10 trials over 4 workers
    assert "4 workers share the budget (GPU-hours of all of them): about 3 trials each" in text
    assert "wall clock" in text


def test_budget_hours_takes_the_smaller_and_defaults_only_for_long_runs() -> None:
    hours, source = budget_hours(search_hours=3.0, search_budget_pct=10, full_run_hours_p50=20)
    assert (hours, source) == (2.0, "10 % of the full run's p50")
    hours, _ = budget_hours(search_hours=1.5, search_budget_pct=10, full_run_hours_p50=20)
    assert hours == 1.5
    hours, source = budget_hours(search_hours=None, search_budget_pct=None, full_run_hours_p50=20)
    assert hours == pytest.approx(DEFAULT_SEARCH_BUDGET_PCT / 100 * 20)
    assert source.startswith("default")
    hours, _ = budget_hours(search_hours=None, search_budget_pct=None, full_run_hours_p50=0.2)
    assert hours is None  # a short run's trials would be mostly fixed cost: no default budget


# -- the ledger and the in-trial stop ---------------------------------------------------------
def _frozen(
    number: int, start: dt.datetime, seconds: float | None, **attrs: Any
) -> optuna.trial.FrozenTrial:
    complete = None if seconds is None else start + dt.timedelta(seconds=seconds)
    state = optuna.trial.TrialState.RUNNING if seconds is None else optuna.trial.TrialState.COMPLETE
    return optuna.trial.FrozenTrial(
        number=number,
        state=state,
        value=1.0 if seconds is not None else None,
        datetime_start=start,
        datetime_complete=complete,
        params={},
        distributions={},
        user_attrs=attrs,
        system_attrs={},
        intermediate_values={},
        trial_id=number,
    )


def test_the_ledger_counts_trials_of_all_workers_running_ones_and_the_set_up() -> None:
    t0 = dt.datetime(2026, 1, 1, 12, 0, 0)
    trials = [
        _frozen(0, t0, 100.0),
        _frozen(1, t0, 50.0),  # another worker, at the same time
        _frozen(2, t0 + dt.timedelta(seconds=100), None),  # running for 30 s at `now`
    ]
    now = t0 + dt.timedelta(seconds=130)
    assert spent_seconds(trials, now=now, before_trials_seconds=7.0) == pytest.approx(187.0)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_ledger_runs_from_launch_to_exit_and_reserves_the_close() -> None:
    t0 = dt.datetime(2026, 1, 1, 12, 0, 0)
    study = optuna.create_study()
    study.add_trial(_frozen(0, t0, 30.0))  # another worker's trial
    study.set_user_attr(BEFORE_TRIALS_ATTR, 15.0)  # 10 s this session's set-up, 5 s another's
    clock = Clock()
    keeper = BudgetKeeper(
        study, _plan(COST, 100 / 3600), stored_seconds=10.0, launched=0.0, clock=clock,
        now=lambda: t0 + dt.timedelta(seconds=40),
    )  # fmt: skip
    assert keeper.reserve_seconds == 5.0  # no close measured yet: min(set-up, 5 % of budget)
    assert keeper.usable_seconds == 95.0
    clock.t = 40.0  # this session's wall clock since launch, its set-up and gaps included
    assert keeper.spent() == pytest.approx(40.0 + 5.0 + 30.0)
    study.add_trial(_frozen(1, t0, 20.0))
    keeper.record(study, study.trials[1])  # this session's own: in its wall clock already
    assert keeper.spent() == pytest.approx(75.0)
    # The close is timed from the end of the session's last trial (what follows is close work).
    assert keeper.trials_ended == 40.0
    clock.t = 43.0
    final = keeper.finish({"ended_by": "n_trials"})
    assert final["tail_seconds"] == pytest.approx(3.0)
    assert final["spent_hours"] == pytest.approx(78.0 / 3600)
    # On the study: this session's time outside its trials (43 - 20 s), its close measured.
    assert study.user_attrs[BEFORE_TRIALS_ATTR] == pytest.approx(5.0 + 23.0)
    assert study.user_attrs[TAIL_ATTR] == pytest.approx(3.0)
    assert BudgetKeeper(study, _plan(COST, 100 / 3600)).reserve_seconds == pytest.approx(3.0)


def test_the_summary_after_workers_counts_their_time_once_and_says_what_ended_them() -> None:
    t0 = dt.datetime(2026, 1, 1, 12, 0, 0)
    study = optuna.create_study()
    for number in range(4):  # two workers' trials, 30 s each
        study.add_trial(_frozen(number, t0, 30.0))
    # The workers' time outside their trials (20 s), the parent's set-up (4 s) added at start.
    study.set_user_attr(BEFORE_TRIALS_ATTR, 20.0 + 4.0)
    study.set_user_attr(ENDED_ATTR, "search budget")  # what ended the workers
    clock = Clock()
    keeper = BudgetKeeper(
        study, _plan(COST, 200 / 3600), stored_seconds=4.0, launched=0.0, clock=clock, now=lambda: t0
    )  # fmt: skip
    keeper.after_workers = True
    keeper.trials_ended, clock.t = 4.0, 6.0  # the parent runs no trial, then closes (2 s)
    final = keeper.finish(keeper.report(keeper.ended_by(4, 4)))  # n_trials: what it finished
    assert final["ended_by"] == "search budget"
    # Each second once: the workers' trials and outside time, the parent's set-up and close.
    assert final["spent_hours"] * 3600 == pytest.approx(4 * 30.0 + 20.0 + 6.0)
    assert study.user_attrs[BEFORE_TRIALS_ATTR] == pytest.approx(20.0 + 6.0)
    assert study.user_attrs[ENDED_ATTR] == "search budget"


def test_budget_stop_stops_at_the_evaluation_nearest_the_end_of_the_budget() -> None:
    clock, spent = Clock(), {"s": 0.0}
    stopped: list[bool] = []
    stop = BudgetStop(lambda: spent["s"], 100.0, clock=clock, on_stop=lambda: stopped.append(True))
    for step, now in enumerate((20.0, 40.0, 60.0, 80.0), start=1):
        clock.t, spent["s"] = now, now
        assert not stop.on_eval(EvalInfo(step=step, loss=1.0, seconds=0.1))
    clock.t, spent["s"] = 95.0, 95.0  # the next interval (15 s) would end 10 s past the budget
    assert stop.on_eval(EvalInfo(step=5, loss=1.0, seconds=0.1))
    assert stopped == [True] and stop.stopped


def test_a_real_run_stops_at_its_next_evaluation_and_keeps_what_it_has(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    spec = demo_spec(
        tiny_model_dir,
        tmp_path,
        lora=LoraSpec(r=8, alpha=16),
        micro_batch_size=8,
        learning_rate=3e-3,
        max_steps=12,
        eval_interval=2,
        eval_samples=16,
    )
    evals: list[int] = []

    def spent() -> float:  # the budget is gone once two evaluations are in
        return 0.0 if len(evals) < 2 else 1e9

    class Count(BudgetStop):
        def on_eval(self, info: EvalInfo) -> bool:
            evals.append(info.step)
            return super().on_eval(info)

    result = train(spec, [Count(spent, 3600.0, clock=Clock())])
    assert result.optimizer_steps == 4  # stopped at the second evaluation, not at 12
    assert [s for s, _ in result.eval_losses][:2] == [2, 4]
    assert result.stop_reason


# -- a real study -----------------------------------------------------------------------------
def _config(work: Path, model: Path, data: Path, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "data": str(data),
        "study_name": "budgeted",
        "n_trials": 40,
        "trial_fraction": 0.3,
        "trial_evals": 3,
        "sampler": "random",
        "system_metrics_seconds": 0,
        "seed": 3,
    }
    return short_study(work, model, {**values, **overrides})


def test_a_study_ends_when_its_budget_is_spent_whatever_n_trials_says(
    tiny_model_dir: Path, small_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path / "w", tiny_model_dir, small_data)
    estimator = StudyEstimator(config, prepare(config), cpu_probe=FAST_PRIOR)
    plan = make_plan(config, estimator)
    # The base model's load, four predicted trials and a minute of set-up (20 s on the loaded
    # 2-vCPU VM): room for a first trial. The prediction's fixed parts are priors: a trial that
    # reuses the base model ran 0.4-1.2 s against 3 s predicted; 400 do not fit unless a
    # trial, Trainer and Optuna included, runs in under a seventh of a second.
    budget = plan.once_hours + 4 * plan.trial_hours + 60 / 3600
    config = _config(tmp_path / "w", tiny_model_dir, small_data, search_hours=budget, n_trials=400)
    summary = run_study(
        config,
        progress=False,
        estimator_factory=lambda c, p: StudyEstimator(c, p, cpu_probe=FAST_PRIOR),
    )
    search = summary.search
    finished = sum(summary.states.values())
    assert search["ended_by"] == "search budget"
    assert 1 <= finished < 400
    assert search["budget_hours"] == pytest.approx(budget)
    assert search["planned_hours"] <= budget * 1.000001
    assert 0 < search["before_trials_hours"] < budget  # the set-up is search time too
    # Overshoot: at most the last trial (it stops at an evaluation, the study then ends).
    study = optuna.load_study(study_name="budgeted", storage=config.storage_url)
    longest = max(
        (t.datetime_complete - t.datetime_start).total_seconds()
        for t in study.trials
        if t.datetime_complete and t.datetime_start
    )
    # The close (summary, report, MLflow's finish) is in the ledger, and measured for the next;
    # this first session reserved a prior for it (at most 5 % of the budget), so a close longer
    # than that prior overshoots by the difference too.
    assert search["tail_seconds"] > 0 and search["reserve_seconds"] > 0
    late_close = max(0.0, search["tail_seconds"] - search["reserve_seconds"])
    assert search["spent_hours"] <= budget + (longest + late_close) / 3600, search
    assert search["spent_over_budget"] == pytest.approx(search["spent_hours"] / budget)
    assert search["fixed_source"].startswith("measured on")  # refitted as trials finished

    from mlflow import MlflowClient

    run = MlflowClient(summary.tracking_uri).get_run(summary.mlflow_parent_run_id)
    # The params: the plan before the first trial (the summary's is refitted since).
    assert run.data.params["search_plan.trials"] == str(study.user_attrs["search_plan"]["trials"])
    assert float(run.data.params["search_plan.budget_hours"]) == pytest.approx(budget, rel=1e-4)
    # The parent run's, the study's and the report's spend are the summary's, written after
    # the report, the close included (before: MLflow's read lower by the close).
    assert run.data.metrics["search_spent_hours"] == pytest.approx(search["spent_hours"])
    assert run.data.metrics["search_spent_over_budget"] == pytest.approx(
        search["spent_over_budget"]
    )
    assert study.user_attrs["search_spent"]["spent_hours"] == pytest.approx(search["spent_hours"])
    assert run.data.tags["search_ended_by"] == "search budget"
    from analysis.report.document import search_line

    line = search_line(search)
    assert line and summary.report_path and line in Path(summary.report_path).read_text()
    logged_report = Path(run.info.artifact_uri.removeprefix("file://"), "report")
    assert line in (logged_report / Path(summary.report_path).name).read_text()

    # The summary names what each plan counts; its opening plan is the one printed first.
    # (after the training length's line)
    opening = next(x for x in capsys.readouterr().out.splitlines() if "GPU time in all" in x)
    print_summary(summary, {})
    said = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("search:"))
    first = format_hours(search["opening"]["planned_hours"])
    assert f"{first} of GPU time in all" in opening
    assert f"planned {first} of GPU time at the start (set-up " in said
    assert f"re-planned {format_hours(search['planned_hours'])} on the trials' measured" in said

    # Run again: the budget is spent, so no trial starts (and the parent's params stand).
    again = run_study(
        config,
        progress=False,
        estimator_factory=lambda c, p: StudyEstimator(c, p, cpu_probe=FAST_PRIOR),
    )
    assert again.search["ended_by"] == "search budget"
    assert sum(again.states.values()) == finished
    assert again.search["fidelity"] == pytest.approx(search["fidelity"])


def test_a_budgeted_study_keeps_the_promotions_time_and_promotes(
    tiny_model_dir: Path, small_data: Path, tmp_path: Path
) -> None:
    config = _config(tmp_path / "w", tiny_model_dir, small_data, promote=1, promote_fraction=0.6)
    estimator = StudyEstimator(config, prepare(config), cpu_probe=FAST_PRIOR)
    plan = make_plan(config, estimator)
    # Room for the base model's load, a predicted trial (more run: the prior is slow), one
    # promoted trial (at 0.6, twice a trial's share) and 20 s of set-up (2 s here: the model
    # and data are prepared); more trials asked than fit.
    promoted = plan.fixed_hours + 2 * (plan.trial_hours - plan.fixed_hours)
    budget = plan.once_hours + plan.trial_hours + promoted + 20 / 3600
    config = _config(
        tmp_path / "w", tiny_model_dir, small_data, search_hours=budget, n_trials=400,
        promote=1, promote_fraction=0.6,
    )  # fmt: skip
    summary = run_study(
        config,
        progress=False,
        estimator_factory=lambda c, p: StudyEstimator(c, p, cpu_probe=FAST_PRIOR),
    )
    search = summary.search
    assert search["promote"] == 1 and search["opening"]["promote_hours"] > 0
    assert search["ended_by"] == "search budget"
    study = optuna.load_study(study_name="budgeted", storage=config.storage_url)
    # The trials stopped where the promotion's time began: the best of them was promoted.
    (again,) = [t for t in study.trials if "promoted_from" in t.user_attrs]
    assert again.state == optuna.trial.TrialState.COMPLETE
    first = study.trials[again.user_attrs["promoted_from"]]
    assert again.params == first.params
    longest = max(
        (t.datetime_complete - t.datetime_start).total_seconds()
        for t in study.trials
        if t.datetime_complete and t.datetime_start
    )
    late_close = max(0.0, search["tail_seconds"] - search["reserve_seconds"])
    assert search["spent_hours"] <= budget + (longest + late_close) / 3600, search


@pytest.mark.parametrize(
    ("flag", "value", "field"),
    [
        ("--search-hours", "0", "search_hours"),
        ("--search-hours", "-1", "search_hours"),
        ("--search-budget-pct", "0", "search_budget_pct"),
    ],
)
def test_a_bad_search_budget_exits_2_naming_the_field(
    flag: str, value: str, field: str, tmp_path: Path
) -> None:
    out = run_module("hpo.study", "--work-dir", str(tmp_path), flag, value, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0]


def test_analysis_plan_prints_the_search_plan_next_to_the_full_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "plan.json"
    args = [
        "--model-config", "mistral-7b-v0.1", "--gpu", "H100", "--samples", "600000",
        "--tokens-per-sample", "300", "--max-length", "512", "--epochs", "3",
        "--micro-batch-size", "2", "--gradient-accumulation-steps", "8",
        "--window-hours", "48", "--search-budget-pct", "10", "--json", str(out_json),
    ]  # fmt: skip
    from analysis.plan import main as plan_main

    assert plan_main(args) == 0
    printed = capsys.readouterr().out
    assert "search budget" in printed and "full run for comparison" in printed
    search = json.loads(out_json.read_text())["search"]
    full_p50 = json.loads(out_json.read_text())["plan"]["duration_hours"]["p50"]
    assert search["budget_hours"] == pytest.approx(0.1 * full_p50)
    assert search["planned_hours"] <= search["budget_hours"] * 1.000001
    assert search["trials"] >= 1 and 0 < search["fidelity"] <= 0.1
    # Hours-long trials at 0.1 would not fit 10 into a tenth of the run: fidelity goes down.
    assert search["fidelity"] < 0.1
    assert search["search_and_run_hours_p50"] == pytest.approx(search["planned_hours"] + full_p50)
    # Promotions come out of the budget first: two from 0.05 to 0.1 (each continues its
    # trial: a twentieth of the run and a trial's fixed cost) of 40 %.
    more = ["--search-budget-pct", "40", "--trial-fraction", "0.05", "--promote", "2"]
    more += ["--promote-fraction", "0.1"]
    assert plan_main([*args[:-4], *more, "--json", str(out_json)]) == 0
    promoted = json.loads(out_json.read_text())["search"]
    assert promoted["promote"] == 2
    assert 0.09 * full_p50 < promoted["promote_hours"] <= 0.12 * full_p50
    assert promoted["planned_hours"] <= 0.4 * full_p50 * 1.000001
    printed = capsys.readouterr().out
    assert "then the 2 best to " in printed and "(2 to 0.1) do not fit the budget" in printed
    # What a search of this size picked on recorded curves is the default rungs' measure.
    assert promoted["expected_pick"] is None and "on recorded real LoRA curves" not in printed
    # The default rungs, 6 then 2, scaled into 60 %: their trials kept, their shares lower.
    assert plan_main([*args[:-4], "--search-budget-pct", "60", "--json", str(out_json)]) == 0
    default = json.loads(out_json.read_text())["search"]
    assert default["rungs_asked"] == [[6, 0.12], [2, 0.44]] and default["promote"] == 8
    (_, low), (_, high) = default["rungs"]
    assert low < 0.12 and high < 0.44 and default["planned_hours"] <= 0.6 * full_p50 * 1.000001
    printed = capsys.readouterr().out
    assert "it holds them at shorter shares" in printed
    # What that size bought on the recorded real curves, and what the whole schedule would.
    assert default["expected_pick"]["unscaled"]["pick_in_best_two"] >= 0.8
    assert "on recorded real LoRA curves" in printed and "the unscaled schedule" in printed


def test_hpo_init_writes_the_search_budget_the_study_reads(
    tiny_model_dir: Path, small_data: Path, tmp_path: Path
) -> None:
    from hpo.init import main as init_main

    out = tmp_path / "study.yaml"
    argv = ["--yes", "--model", str(tiny_model_dir), "--data", str(small_data)]
    assert init_main([*argv, "--out", str(out), "--search-hours", "3"]) == 0
    assert load_config(str(out)).budget.search_hours == 3
    default = tmp_path / "default.yaml"
    assert init_main([*argv, "--out", str(default)]) == 0
    budget = load_config(str(default)).budget
    assert (budget.search_hours, budget.search_budget_pct) == (None, None)
    assert "search_budget_pct" in default.read_text()  # the default, said in a comment
    bad = run_module(
        "hpo.init", "--yes", "--out", str(tmp_path / "x.yaml"), "--search-budget-pct", "-5",
        timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "search_budget_pct" in bad.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_the_report_line_shows_spend_against_the_budget_with_a_bar() -> None:
    from analysis.report.document import search_line

    over = {"spent_hours": 1.1, "budget_hours": 1.0, "planned_hours": 0.9, "ended_by": "x"}
    line = search_line(over, width=10)
    assert line is not None and "110% of the budget" in line and "ended by x" in line
    assert "[##########|#]" in line  # the bar runs past the 100 % mark
    under = {"spent_hours": 0.5, "budget_hours": None, "planned_hours": 1.0, "ended_by": "n"}
    assert "[#####.....|]" in (search_line(under, width=10) or "")
    assert search_line(None) is None and search_line({"trials": 3}) is None
