"""The full run watches itself: early stopping, the best checkpoint, advice, MLflow records.

One real full run (`python -m trainers.train`, in-process) on the tiny model with an
over-parametrised adapter (rank 64, no dropout) that overfits by construction: its training
samples walk a word list in steps of one, its validation samples in steps of five over the
same words. Learning the training transitions is all the run can do, and every transition it
learns puts its probability on the word the validation samples do not take next: the
training loss falls while the validation loss rises, whatever the CPU's numerics (seen:
+10-15 % above its best when it stops). It stops early, names its best checkpoint and advises
against overfitting.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

from common.cli import run_cli
from trainers.data.paths import demo_data_path
from trainers.loop import checkpoint
from trainers.loop.early_stopping import EarlyStopping, advise
from trainers.spec import TrainSpec
from trainers.train import DEFAULT_EARLY_STOPPING_PATIENCE, main, with_full_run_defaults


def _train_in(folder: Path, argv: list[str]) -> int:
    """`trainers.train` in this process, run from `folder`: MLflow's SQLite store puts
    artifacts under ./mlruns, so they stay in the test's folder."""
    with contextlib.chdir(folder):
        return run_cli(main, argv)


@pytest.fixture(scope="module")
def overfitting_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("overfit")
    data = tmp / "walks.jsonl"
    _write_contradicting_walks(data, tiny_model_dir, count=64, validation_fraction=0.5)
    tracking = f"sqlite:///{tmp / 'mlflow.db'}"
    argv = [
        "--model", str(tiny_model_dir), "--data", str(data), "--output-dir", str(tmp / "out"),
        "--lora-r", "64", "--lora-alpha", "128", "--lora-dropout", "0",
        "--micro-batch-size", "8", "--learning-rate", "3e-3", "--max-steps", "120",
        "--max-length", "64", "--validation-fraction", "0.5",
        "--eval-interval", "5", "--eval-samples", "16",
        "--early-stopping-patience", "3", "--cache-dir", str(tmp / "cache"),
        "--tracking-uri", tracking, "--system-metrics-seconds", "0.2",
        "--json", str(tmp / "result.json"), "--quiet",
    ]  # fmt: skip
    code = _train_in(tmp, argv)
    report = json.loads((tmp / "result.json").read_text(encoding="utf-8"))
    return code, report, tracking


def _write_contradicting_walks(
    path: Path, model_dir: Path, *, count: int, validation_fraction: float
) -> None:
    """Training samples step through 16 one-token words by 1, validation samples by 5.

    The split is the trainer's own (`split_indices`, seed 0), so each side gets its walks.
    """
    from transformers import AutoTokenizer

    from trainers.data.dataset import split_indices

    vocab = AutoTokenizer.from_pretrained(model_dir).get_vocab()
    words = sorted(w[1:] for w in vocab if w.startswith("Ġ") and w[1:].isalpha())[:16]
    assert len(words) == 16

    def walk(start: int, stride: int) -> str:
        return " ".join(words[(start + stride * i) % len(words)] for i in range(12))

    train, validation = split_indices(count, validation_fraction, 0)
    lines = [""] * count
    for k, i in enumerate(train):
        lines[i] = json.dumps({"text": walk(k, 1)})
    for k, i in enumerate(validation):
        lines[i] = json.dumps({"text": walk(k, 5)})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_rising_validation_loss_stops_early_with_exit_0(overfitting_run) -> None:
    code, report, _ = overfitting_run
    assert code == 0
    assert report["status"] == "stopped_early"
    assert "has not improved by 0.001 for 3 evaluations" in report["stop_reason"]
    assert report["final_step"] < report["total_steps"] == 120
    losses = [loss for _, loss in report["eval_losses"]]
    assert min(losses[-3:]) >= min(losses) - 1e-3  # the last 3 did not improve
    assert losses[-1] > 1.03 * min(losses)  # it rose, with a margin (seen: +10-15 %)


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
    # Its best evaluation, which its study reads as the configuration's loss.
    assert run.data.metrics["val_loss_best"] == pytest.approx(report["best_val_loss"])
    assert run.data.metrics["best_step"] == report["best_step"]


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
    assert with_full_run_defaults(spec, {}).early_stopping_patience == DEFAULT_EARLY_STOPPING_PATIENCE
    off = TrainSpec(model="m", data="d.jsonl", early_stopping_patience=0)
    assert with_full_run_defaults(off, {"early_stopping_patience": 0}).early_stopping_patience == 0


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


@pytest.mark.parametrize(
    ("val", "train", "lr", "kind", "words"),
    [
        # The stuck run of issue 22: ln V = 6.55, nothing learned at a rate of 0.05.
        ([6.186, 6.228, 6.248, 6.202], [6.5, 6.3, 6.31, 6.29], 0.05, "not learning",
         ["0.05 is likely too high", "try 5e-03"]),
        # Rising from the start while training does not fall: diverging.
        ([4.0, 4.2, 4.5, 5.1], [4.1, 4.3, 4.6, 5.0], 1e-3, "diverging", ["rate 0.001 is too high", "try 1e-04"]),
        # Flat to the fourth decimal and a rate that cannot move the adapter: too low.
        ([6.5501, 6.5500, 6.5502, 6.5501], [6.56, 6.56, 6.56, 6.56], 1e-9, "not learning",
         ["too little in 40 steps", "try 1e-08"]),
    ],
)  # fmt: skip
def test_advice_names_the_learning_rate_of_a_run_that_does_not_learn(
    val: list[float], train: list[float], lr: float, kind: str, words: list[str]
) -> None:
    advice = advise(_evals(val, train), learning_rate=lr)
    assert len(advice) == 1 and advice[0].startswith(f"{kind}:")
    assert all(w in advice[0] for w in words), advice[0]


@pytest.mark.parametrize(
    ("val", "train"),
    [
        ([6.0, 5.9, 5.94, 5.93], [6.2, 6.0, 6.0, 6.0]),  # 1.7 % below the first: it learned
        ([5.0, 5.1, 5.2, 5.3], [5.0, 3.0, 2.0, 1.0]),  # training falls: overfitting, not stuck
        ([6.0, 6.1], [6.2, 6.2]),  # two evaluations: too early to call
    ],
)
def test_no_not_learning_advice_for_runs_that_learn_or_are_too_young(
    val: list[float], train: list[float]
) -> None:
    advice = advise(_evals(val, train), learning_rate=0.05)
    assert not any(line.startswith(("not learning", "diverging")) for line in advice)


def test_a_run_whose_recovery_gave_up_is_told_so_with_its_learning_rate() -> None:
    reason = "non-finite loss at step 30; gave up after 2 rollback(s) (max_rollbacks=2)"
    (line,) = advise(_evals([5.0, 4.0], [5.0, 4.0]), learning_rate=3e-3, gave_up=reason)
    assert line.startswith("diverged:") and "non-finite loss at step 30" in line
    assert "learning rate 0.003 is too high" in line and "try 3e-04" in line


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


def test_a_run_that_cannot_move_its_adapter_is_told_to_raise_the_learning_rate(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A rate of 1e-9 moves each adapter weight by at most ~1e-8 over the run (Adam's steps
    are about the rate): the losses cannot change, on any CPU, and early stopping ends it."""
    from mlflow import MlflowClient

    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = [
        "--model", str(tiny_model_dir), "--data", str(demo_data_path("prompt_completion")),
        "--output-dir", str(tmp_path / "out"), "--learning-rate", "1e-9", "--max-steps", "40",
        "--max-length", "64", "--eval-interval", "5", "--eval-samples", "16",
        "--early-stopping-patience", "3", "--cache-dir", str(tmp_path / "cache"),
        "--tracking-uri", tracking, "--system-metrics-seconds", "0",
        "--json", str(tmp_path / "result.json"), "--quiet",
    ]  # fmt: skip
    assert _train_in(tmp_path, argv) == 0
    report = json.loads((tmp_path / "result.json").read_text(encoding="utf-8"))
    assert report["status"] == "stopped_early" and report["final_step"] == 20
    (line,) = report["advice"]
    assert line.startswith("not learning:") and "learning rate 1e-09" in line
    assert "try 1e-08" in line
    client = MlflowClient(tracking_uri=tracking)
    (run,) = client.search_runs(_experiment_ids(client))
    assert run.data.tags["advice.not_learning"] == line


def test_an_early_stop_always_says_why_and_what_to_try() -> None:
    # The full run of issue 47: a small drop at a rate of 0.05, then losses that bounce
    # above the best (not a plateau, not overfitting: training does not fall) until patience
    # ran out. Early stopping ended it: the advice says so and names the rate.
    val, train = [2.40, 2.31, 2.33, 2.36, 2.32], [2.5, 2.4, 2.41, 2.40, 2.42]
    assert advise(_evals(val, train), learning_rate=0.05) == []
    advice = advise(_evals(val, train), learning_rate=0.05, stopped_early=True)
    assert len(advice) == 1 and advice[0].startswith("stopped early:")
    for words in ("2.3100 at step 20", "for 3 evaluations", "try 5e-03 (now 0.05)", "below its first"):
        assert words in advice[0], advice[0]
    # Where the curves explain the stop, that reading stays the only line.
    overfit = advise(
        _evals([3.0, 2.5, 2.6, 2.7, 2.8], [3.0, 2.4, 2.0, 1.6, 1.2]), stopped_early=True
    )
    assert [line.split(":")[0] for line in overfit] == ["overfitting"]


def test_an_early_stop_of_a_run_still_improving_says_so_and_not_to_lower_the_rate() -> None:
    # Each evaluation below the one before, but by less than min_delta 0.1 after step 20
    # (not a plateau: 3 % over the last 4): patience ran out on a run whose last evaluation
    # was its best.
    val, train = [2.50, 2.30, 2.27, 2.25, 2.23], [2.6, 2.4, 2.38, 2.37, 2.36]
    (line,) = advise(_evals(val, train), learning_rate=0.05, stopped_early=True, min_delta=0.1)
    assert line == (
        "stopped early while still improving: validation loss fell to 2.2300 at step 50 (its "
        "best), but by less than --early-stopping-min-delta 0.1 below 2.3000 (step 20) for 3 "
        "evaluations; a smaller --early-stopping-min-delta or a larger "
        "--early-stopping-patience lets it run its schedule"
    )
