"""The full run watches itself: early stopping, the best checkpoint, advice, MLflow records.

One real full run (`python -m trainers.train`, in-process) on the tiny model with an
over-parametrised adapter (rank 64, no dropout) and a high learning rate on 42 training
samples: its training loss keeps falling while the validation loss stops improving and rises,
so it stops early, names its best checkpoint and advises against overfitting.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from common.cli import run_cli
from trainers.data.paths import demo_data_path
from trainers.loop import checkpoint
from trainers.loop.early_stopping import EarlyStopping, advise
from trainers.spec import TrainSpec
from trainers.train import DEFAULT_EARLY_STOPPING_PATIENCE, full_run_spec, main


@pytest.fixture(scope="module")
def overfitting_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("overfit")
    data = tmp / "small.jsonl"
    lines = demo_data_path("text").read_text(encoding="utf-8").splitlines()[:60]
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tracking = f"sqlite:///{tmp / 'mlflow.db'}"
    argv = [
        "--model", str(tiny_model_dir), "--data", str(data), "--output-dir", str(tmp / "out"),
        "--lora-r", "64", "--lora-alpha", "128", "--lora-dropout", "0",
        "--micro-batch-size", "8", "--learning-rate", "1e-2", "--max-steps", "120",
        "--max-length", "64", "--validation-fraction", "0.3",
        "--eval-interval", "7", "--eval-samples", "16",
        "--early-stopping-patience", "3", "--cache-dir", str(tmp / "cache"),
        "--tracking-uri", tracking, "--system-metrics-seconds", "0.2",
        "--json", str(tmp / "result.json"), "--quiet",
    ]  # fmt: skip
    # MLflow's SQLite store puts artifacts under ./mlruns: keep them in the test's folder.
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        code = run_cli(main, argv)
    finally:
        os.chdir(cwd)
    report = json.loads((tmp / "result.json").read_text(encoding="utf-8"))
    return code, report, tracking


def test_a_rising_validation_loss_stops_early_with_exit_0(overfitting_run) -> None:
    code, report, _ = overfitting_run
    assert code == 0
    assert report["status"] == "stopped_early"
    assert "has not improved by 0.001 for 3 evaluations" in report["stop_reason"]
    assert report["final_step"] < report["total_steps"] == 120
    losses = [loss for _, loss in report["eval_losses"]]
    assert min(losses[-3:]) >= min(losses) - 1e-3  # the last 3 did not improve


def test_the_best_checkpoint_is_kept_and_named(overfitting_run) -> None:
    _, report, _ = overfitting_run
    step, loss = min(report["eval_losses"], key=lambda x: x[1])
    assert report["best_step"] == step < report["final_step"]
    assert report["best_val_loss"] == pytest.approx(loss)
    best = Path(report["best_checkpoint"])
    assert best.name == f"checkpoint-{step}"
    assert checkpoint.verify(best) is None
    assert checkpoint.read_run_state(best)["val_loss"] == pytest.approx(loss)


def test_overfitting_advice_is_in_the_json_and_on_the_mlflow_run(overfitting_run) -> None:
    from mlflow import MlflowClient

    _, report, tracking = overfitting_run
    assert len(report["advice"]) == 1
    assert report["advice"][0].startswith("overfitting:")
    assert "fewer epochs" in report["advice"][0] and "lower rank" in report["advice"][0]
    train_losses = [r["train_loss"] for r in report["eval_records"] if r["train_loss"]]
    assert train_losses[-1] < train_losses[0]
    client = MlflowClient(tracking_uri=tracking)
    (run,) = client.search_runs(_experiment_ids(client))
    assert run.info.status == "FINISHED"
    assert run.data.tags["status"] == "stopped_early"
    assert run.data.tags["advice.overfitting"] == report["advice"][0]
    assert run.data.tags["best_checkpoint"] == report["best_checkpoint"]


def test_gradient_norms_and_system_metrics_reach_mlflow(overfitting_run) -> None:
    from mlflow import MlflowClient

    _, report, tracking = overfitting_run
    client = MlflowClient(tracking_uri=tracking)
    (run,) = client.search_runs(_experiment_ids(client))
    norms = client.get_metric_history(run.info.run_id, "grad_norm")
    assert len(norms) == report["final_step"]
    assert all(math.isfinite(m.value) and m.value > 0 for m in norms)
    assert [m.value for m in norms] == pytest.approx([n for _, n in report["grad_norms"]])
    assert float(run.data.params["max_grad_norm"]) == 1.0
    gaps = client.get_metric_history(run.info.run_id, "train_val_gap")
    assert len(gaps) == len(report["eval_losses"]) and gaps[-1].value > gaps[0].value
    system = {k for k in run.data.metrics if k.startswith("system/")}
    assert "system/cpu_utilization_percentage" in system
    assert "system/system_memory_usage_megabytes" in system


def _experiment_ids(client: Any) -> list[str]:
    experiment = client.get_experiment_by_name("hpo-lora")
    assert experiment is not None
    return [experiment.experiment_id]


def test_full_runs_stop_early_by_default_and_trials_do_not() -> None:
    spec = TrainSpec(model="m", data="d.jsonl")
    assert spec.early_stopping_patience == 0  # a trial: the pruner judges it
    assert full_run_spec(spec, {}).early_stopping_patience == DEFAULT_EARLY_STOPPING_PATIENCE
    off = TrainSpec(model="m", data="d.jsonl", early_stopping_patience=0)
    assert full_run_spec(off, {"early_stopping_patience": 0}).early_stopping_patience == 0


@pytest.mark.parametrize(
    ("flag", "value", "field"),
    [
        ("--early-stopping-patience", "-1", "early_stopping_patience"),
        ("--early-stopping-min-delta", "-0.1", "early_stopping_min_delta"),
        ("--max-grad-norm", "-1", "max_grad_norm"),
        ("--system-metrics-seconds", "-5", "system_metrics_seconds"),
    ],
)
def test_bad_values_exit_2_naming_the_field(
    flag: str, value: str, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", "m", "--data", str(demo_data_path("text")), flag, value]
    assert run_cli(main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]


def _evals(val: list[float], train: list[float]) -> list[tuple[int, float, Any]]:
    return [(10 * (i + 1), v, t) for i, (v, t) in enumerate(zip(val, train, strict=True))]


@pytest.mark.parametrize(
    ("val", "train", "expected"),
    [
        # The validation loss left its best 3 evaluations ago; training kept falling.
        ([3.0, 2.5, 2.6, 2.7, 2.8], [3.0, 2.4, 2.0, 1.6, 1.2], "overfitting"),
        # Both flat: the learning rate is too high to settle (or too low to move).
        ([3.0, 2.5, 2.501, 2.502, 2.5005], [3.0, 2.5, 2.5, 2.5, 2.5], "plateau"),
        ([3.0, 2.5, 2.2, 2.0, 1.9], [3.0, 2.4, 2.1, 1.9, 1.8], None),  # still learning
        # The best is only 2 evaluations old: too early to call.
        ([3.0, 2.8, 2.5, 2.6, 2.7], [3.0, 2.4, 2.0, 1.6, 1.2], None),
        ([3.0, 2.5, 2.6, 2.7, 2.8], [3.0, 2.4, 2.4, 2.4, 2.4], None),  # training not falling
    ],
)
def test_advice_names_overfitting_and_plateaus(
    val: list[float], train: list[float], expected: str | None
) -> None:
    advice = advise(_evals(val, train))
    assert [line.split(":")[0] for line in advice] == ([expected] if expected else [])


def test_early_stopping_counts_evaluations_without_an_improvement_above_min_delta() -> None:
    stopping = EarlyStopping(patience=2, min_delta=0.01)
    assert stopping.observe(1, 3.0).improved
    assert not stopping.observe(2, 2.995).improved  # less than min_delta: no improvement
    assert stopping.observe(3, 2.9).improved and stopping.best_step == 3
    assert not stopping.observe(4, 2.95).stop
    verdict = stopping.observe(5, 2.91)
    assert verdict.stop and verdict.reason and "best 2.9000 at step 3" in verdict.reason
    stopping.replay([[1, 3.0], [2, 2.5]])  # a rollback dropped the later evaluations
    assert (stopping.best_step, stopping.evals_without_improvement) == (2, 0)


def test_a_resumed_run_continues_the_early_stopping_count(overfitting_run) -> None:
    from trainers.loop.run import _early_stopping

    _, report, _ = overfitting_run
    saved = checkpoint.read_run_state(report["best_checkpoint"])
    assert saved["early_stopping"]["best_step"] == report["best_step"]
    spec = TrainSpec(model="m", data="d.jsonl", early_stopping_patience=3)
    resumed = _early_stopping(spec, saved)
    assert resumed is not None
    assert (resumed.best_step, resumed.best_loss) == (report["best_step"], saved["val_loss"])
    assert resumed.patience == 3 and resumed.evals_without_improvement == 0
    assert _early_stopping(TrainSpec(model="m", data="d.jsonl"), saved) is None  # off
