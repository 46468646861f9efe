"""Real LoRA training runs on the tiny model: loss falls, timings add up, callbacks, CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.cli import run_module
from tests.configs import demo_spec
from trainers.data.paths import demo_data_path
from trainers.events import EvalInfo, StepInfo, TrainingCallback
from trainers.loop.run import train
from trainers.spec import LoraSpec, TrainSpec


def _spec(model: Path, tmp_path: Path, **overrides: object) -> TrainSpec:
    values: dict[str, object] = {
        "lora": LoraSpec(r=16, alpha=32),
        "micro_batch_size": 8,
        "learning_rate": 3e-3,
        "max_steps": 30,
        "eval_interval": 10,
        "eval_samples": 32,
    }
    return demo_spec(model, tmp_path, **{**values, **overrides})


class Recorder(TrainingCallback):
    def __init__(self, stop_at_step: int | None = None) -> None:
        self.steps: list[StepInfo] = []
        self.evals: list[EvalInfo] = []
        self.stop_at_step = stop_at_step

    def on_step(self, info: StepInfo) -> bool:
        self.steps.append(info)
        return self.stop_at_step is not None and info.step >= self.stop_at_step

    def on_eval(self, info: EvalInfo) -> None:
        self.evals.append(info)


@pytest.fixture(scope="module")
def thirty_steps(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("train30")
    recorder = Recorder()
    result = train(_spec(tiny_model_dir, tmp, checkpoint_interval=15), [recorder])
    return result, recorder


def test_validation_loss_falls(thirty_steps) -> None:
    result, _ = thirty_steps
    losses = [loss for _, loss in result.eval_losses]
    assert [step for step, _ in result.eval_losses] == [10, 20, 30]
    assert losses[-1] < losses[0] - 0.05, losses
    assert result.final_eval_loss == losses[-1]
    assert math.isfinite(result.final_train_loss)


def test_timing_parts_add_up(thirty_steps) -> None:
    result, _ = thirty_steps
    parts = result.timings
    assert set(parts) == {"startup", "train", "eval", "checkpoint"}
    assert all(v >= 0 for v in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(result.wall_seconds, rel=1e-9)
    assert parts["eval"] > 0 and parts["checkpoint"] > 0 and parts["startup"] > 0
    assert len(result.checkpoint_seconds) == 2  # steps 15 and 30
    assert len(result.eval_records) == 3
    # One micro-step per optimizer step at accumulation 1; each measured separately.
    assert len(result.micro_step_seconds) == 30 == len(result.optimizer_step_seconds)
    assert sum(result.micro_step_seconds) < sum(result.step_seconds)
    assert result.tokens_per_second > 0 and result.peak_memory_bytes > 0
    assert result.tokens_seen == sum(result.micro_step_tokens)


def test_callbacks_see_every_step_and_eval(thirty_steps) -> None:
    result, recorder = thirty_steps
    assert [s.step for s in recorder.steps] == list(range(1, 31))
    assert [e.step for e in recorder.evals] == [10, 20, 30]
    assert all(s.total_steps == 30 and s.tokens > 0 for s in recorder.steps)
    assert [s.loss for s in recorder.steps] == [loss for _, loss in result.train_losses]


def test_gradient_accumulation_counts_micro_steps(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = train(
        _spec(tiny_model_dir, tmp_path, max_steps=4, gradient_accumulation_steps=3, eval_interval=0)
    )
    assert result.optimizer_steps == 4
    assert len(result.micro_step_seconds) == 12
    assert len(result.optimizer_step_seconds) == 4
    assert [s for s, _ in result.eval_losses] == [4]  # the final evaluation always happens


def test_a_callback_can_stop_the_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    recorder = Recorder(stop_at_step=3)
    result = train(_spec(tiny_model_dir, tmp_path, max_steps=20), [recorder])
    assert result.optimizer_steps == 3
    assert result.stop_reason == "Recorder.on_step"


def test_cli_writes_json(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = run_module(
        "trainers.train", "--model", str(tiny_model_dir),
        "--data", str(demo_data_path("text")),
        "--max-steps", "6", "--eval-interval", "3", "--micro-batch-size", "4",
        "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(tmp_path / "o"),
        "--json", str(out), "--quiet",
        cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads(out.read_text())
    for key in (
        "eval_losses", "final_train_loss", "tokens_per_second", "optimizer_steps",
        "wall_seconds", "timings", "peak_memory_bytes", "device", "trainable_parameters",
    ):  # fmt: skip
        assert key in payload, key
    assert payload["optimizer_steps"] == 6
    assert [s for s, _ in payload["eval_losses"]] == [3, 6]
    assert set(payload["timings"]) == {"startup", "train", "eval", "checkpoint"}
    assert payload["device"] == "cpu"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--data", "missing.jsonl"], "missing.jsonl"),
        (["--micro-batch-size", "0"], "micro_batch_size"),
        (["--learning-rate", "5"], "learning_rate"),
        (["--precision", "bf16"], "precision"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(
    tiny_model_dir: Path, tmp_path: Path, args: list[str], expected: str
) -> None:
    base = ["--model", str(tiny_model_dir), "--data", str(demo_data_path("text"))]
    out = tmp_path / "r.json"
    proc = run_module(
        "trainers.train", *base, *args, "--json", str(out), "--quiet", cwd=tmp_path, timeout=600
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert not out.exists()
