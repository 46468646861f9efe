"""The loss-shape reference run: it identifies the annealing term, is budgeted and listed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest

from analysis.curves.law import JointFit
from analysis.search.schedule import TrialCost
from hpo.final_loss import TrialCurve, predict_final_loss, shared_shape
from hpo.keys import REFERENCE_ATTR, SHAPE_CURVE_PREFIX
from hpo.reference_run import REFERENCE_BUDGET_SHARE, reference_line, reference_size, reference_spec
from tests.configs import demo_spec, short_study

SHARED = (1.5, 4.0, 0.7, 2.0, 0.03)  # L0, D, alpha, beta, C: the law the curves follow
FULL_STEPS = 1000


def _law_curve(
    steps: list[int], total: int, log_tau: float, rng: np.random.Generator
) -> TrialCurve:
    """A curve that follows the law with C = SHARED[4] on a linear schedule of `total` steps."""
    curve = TrialCurve(
        steps=tuple(steps), samples=tuple(steps), losses=tuple(0.0 for _ in steps),
        scheduler="linear", warmup_ratio=0.05, learning_rate=1e-3, full_run_steps=total,
    )  # fmt: skip
    data = curve.data()
    law = JointFit(SHARED, (log_tau,), 0.0, 0)
    losses = law.loss(0, data.s1, data.s2) + rng.normal(0.0, 0.003, data.s1.size)
    return TrialCurve(**{**curve.to_attr(), "steps": tuple(steps), "losses": tuple(losses)})


def test_the_reference_run_identifies_the_annealing_term(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    # Trials: the first 3 % of their 1000-step runs, where the rate has not begun to fall.
    trials = [_law_curve(list(range(5, 31, 5)), FULL_STEPS, tau, rng) for tau in (2, 2.5, 3, 3.5)]
    spec = reference_spec(
        demo_spec(tmp_path / "model", tmp_path, scheduler="linear", warmup_ratio=0.05),
        FULL_STEPS, fraction=0.2, evals=12,
    )  # fmt: skip
    assert spec.max_steps == 200 and spec.stop_after_steps is None and spec.eval_interval == 16
    steps = list(range(spec.eval_interval, 201, spec.eval_interval)) + [200]
    reference = _law_curve(sorted(set(steps)), spec.max_steps, 2.5, rng)

    without = shared_shape(trials)
    assert without["annealing"] < 1e-9  # no trial saw a decay: C is held at 0
    shape = shared_shape([*trials, reference])
    assert shape["annealing"] == pytest.approx(SHARED[4], rel=0.15)
    assert shape["alpha"] == pytest.approx(SHARED[2], rel=0.3)

    # A trial's predicted final loss: within 10 % of the law's with the reference; without
    # it, the law holds C at 0 and misses the decay by far more.
    target = trials[0]
    data = target.data()
    truth = float(JointFit(SHARED, (2.0,), 0.0, 0).loss(0, data.s1_end, data.s2_end))
    from analysis.curves.correction import LossCorrection

    def p50(peers: list[TrialCurve]) -> float:
        final = predict_final_loss(
            target, peers=peers, full_run_samples=FULL_STEPS, correction=LossCorrection()
        )
        return final.fit.p50

    assert p50([*trials[1:], reference]) == pytest.approx(truth, rel=0.1)
    assert abs(p50(trials[1:]) / truth - 1) > 0.5


def test_a_study_runs_its_reference_once_budgeted_and_listed(
    tiny_model_dir: Path, small_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpo.runner import run_study
    from hpo.summary import print_summary

    values: dict[str, Any] = {
        "data": str(small_data), "study_name": "shaped", "n_trials": 4, "trial_fraction": 0.05,
        "trial_evals": 3, "sampler": "random", "system_metrics_seconds": 0, "seed": 3,
        "reference_fraction": 0.15, "search_hours": 1.0,
    }  # fmt: skip
    config = short_study(tmp_path / "w", tiny_model_dir, values)
    summary = run_study(config, progress=False)
    record = summary.reference_run
    assert record["state"] == "complete" and record["fraction"] == 0.15
    assert record["seconds"] > 0 and record["curves"] >= 4  # 3 trials and the reference
    study = optuna.load_study(study_name="shaped", storage=config.storage_url)
    assert len(study.trials) == 4  # the reference is no trial: nothing the pick could take
    assert study.user_attrs[REFERENCE_ATTR] == record
    assert SHAPE_CURVE_PREFIX + "reference" in study.user_attrs
    # Its seconds are search time: the ledger's spent covers the trials and the reference.
    trials = sum(
        (t.datetime_complete - t.datetime_start).total_seconds()
        for t in study.trials
        if t.datetime_complete and t.datetime_start
    )
    assert summary.search["spent_hours"] * 3600 >= trials + record["seconds"]
    print_summary(summary, {})
    assert reference_line(record) in capsys.readouterr().out
    assert "fitted alpha" in reference_line(record)

    from mlflow import MlflowClient

    run = MlflowClient(summary.tracking_uri).get_run(summary.mlflow_parent_run_id)
    assert run.data.params["reference_run.fraction"] == "0.15"
    assert run.data.tags["reference_run"] == reference_line(record)


class _Study:
    """What `add_full_run_curves` reads and writes of an Optuna study."""

    def __init__(self, name: str) -> None:
        self.study_name = name
        self.user_attrs: dict[str, Any] = {}

    def set_user_attr(self, key: str, value: Any) -> None:
        self.user_attrs[key] = value


def _report(study: str, status: str = "finished", data: str = "/d/data.jsonl") -> dict[str, Any]:
    return {
        "status": status, "final_step": 100, "final_eval_loss": 1.2,
        "eval_records": [{"step": s, "samples_seen": 8 * s, "loss": 3.0 - s / 50} for s in (20, 40, 60, 80)],
        "spec": {"scheduler": "linear", "warmup_ratio": 0.05, "learning_rate": 1e-3, "data": data},
        "provenance": {"study": study},
    }  # fmt: skip


def test_full_runs_of_the_study_join_the_shared_fit_with_their_whole_curve() -> None:
    from analysis.calibration.full_runs import FullRun
    from hpo.final_loss import study_peers
    from hpo.reference_run import add_full_run_curves

    study = _Study("mine")
    runs = [
        FullRun("a", _report("mine")),
        FullRun("b", _report("another study")),
        FullRun("c", _report("mine", status="stopped_by_window")),  # its schedule's end unseen
        FullRun("d", _report("mine", data="/d/other.jsonl")),  # trained on other data
    ]
    assert add_full_run_curves(study, runs, "/d/data.jsonl") == 1  # type: ignore[arg-type]
    (curve,) = study_peers([], study.user_attrs)
    assert curve.full_run_steps == 100 and curve.steps == (20, 40, 60, 80, 100)
    assert curve.losses[-1] == 1.2
    data = curve.data()
    assert data.s2[-1] == data.s2_end > 0  # it saw its whole decay: it identifies C


# A trial at fidelity f costs 3 s + 100 s x f (the time model's TrialCost); trials train 0.02.
COST = TrialCost(fixed=3.0, per_fidelity=100.0)


def _size(budget: float | None, left: float, cost: TrialCost | None = COST) -> Any:
    return reference_size(
        0.3, trial_fidelity=0.02, budget_seconds=budget, left_seconds=left, cost=cost,
        typical_trial_seconds=5.0,
    )  # fmt: skip


def test_the_reference_is_sized_to_a_share_of_the_search_budget() -> None:
    # No budget, or one with room: the study's reference_fraction as it is.
    assert _size(None, 0.0).fraction == 0.3
    assert _size(10_000.0, 9_000.0).fraction == 0.3
    # A 120 s budget: 15 % (18 s) buys (18 - 2 x 3) / 100 = 0.12 of the full run, twice the
    # evaluations of a trial included; its predicted cost is within that share.
    tight = _size(120.0, 100.0)
    assert tight.fraction == pytest.approx(0.12)
    cost = 2 * COST.fixed + COST.per_fidelity * tight.fraction
    assert cost <= REFERENCE_BUDGET_SHARE * 120.0 + 1e-9
    # Never more than half of what is left for the trials: 10 s buys (10 - 6) / 100.
    assert _size(120.0, 20.0).fraction == pytest.approx(0.04)
    # Without the time model's cost: typical trials scaled by fidelity (18 s / 5 s x 0.02).
    assert _size(120.0, 100.0, cost=None).fraction == pytest.approx(0.072)


def test_a_reference_the_budget_cannot_buy_is_skipped_and_says_why() -> None:
    # 15 % of 60 s buys (9 - 6) / 100 = 0.03 of the run, under twice a trial's 0.02.
    size = _size(60.0, 50.0)
    assert size.fraction == 0.0
    assert "skipped" in size.reason and "0.03" in size.reason and "0.02" in size.reason
    line = reference_line({"trial": 4, "state": "skipped", "reason": size.reason})
    assert line.startswith("loss-shape reference run: trial 4's configuration, skipped: ")
