"""A trial is the start of its full run, and every run of a study evaluates the same tokens."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.configs import demo_spec
from trainers.loop.inputs import RunInputs
from trainers.loop.run import train
from trainers.spec import LoraSpec, TrainSpec


def _full_run(model: Path, tmp_path: Path, **overrides: object) -> TrainSpec:
    values: dict[str, object] = {
        "lora": LoraSpec(r=8, alpha=16, dropout=0.0),
        "micro_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "learning_rate": 3e-3,
        "warmup_ratio": 0.1,
        "epochs": 0.2,  # ~34 steps: a short "full run" whose decay horizon is its own
        "eval_interval": 4,
        "eval_samples": 16,
        "max_length": 96,
        "eval_max_length": 128,
    }
    return demo_spec(model, tmp_path, **{**values, **overrides})


def test_trial_losses_are_the_first_losses_of_its_full_run(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    full_spec = _full_run(tiny_model_dir, tmp_path / "full")
    trial_spec = dataclasses.replace(
        full_spec, output_dir=str(tmp_path / "trial" / "out"), stop_after_steps=12
    )
    full = train(full_spec)
    trial = train(trial_spec)

    assert trial.status == "finished" and trial.final_step == 12
    # The trial ran the full run's schedule: its horizon is the full run's step count.
    assert trial.total_steps == full.total_steps > 12
    assert [s for s, _ in trial.train_losses] == list(range(1, 13))
    for (step, loss), (full_step, full_loss) in zip(
        trial.train_losses, full.train_losses, strict=False
    ):
        assert step == full_step
        assert loss == pytest.approx(full_loss, abs=1e-4)
    full_evals = dict((int(s), loss) for s, loss in full.eval_losses)
    assert [int(s) for s, _ in trial.eval_losses] == [4, 8, 12]
    for step, loss in trial.eval_losses:
        assert loss == pytest.approx(full_evals[int(step)], abs=1e-4)
    # Where the trial stopped, the full run went on learning at the same rates.
    assert full.eval_losses[-1][1] < trial.eval_losses[-1][1]


def test_eval_records_count_the_data_seen(tiny_model_dir: Path, tmp_path: Path) -> None:
    spec = _full_run(tiny_model_dir, tmp_path, stop_after_steps=8)
    result = train(spec)
    seen = [(r["step"], r["samples_seen"]) for r in result.eval_records]
    # 8 samples x 2 micro-steps per optimizer step.
    assert seen == [(4, 64), (8, 128)]
    assert all(r["tokens_seen"] > 0 for r in result.eval_records)


def _data(spec: TrainSpec) -> Any:
    inputs = RunInputs(keep_base=False)
    try:
        return inputs.attach(spec, "cpu").data
    finally:
        inputs.release()


def test_profiles_with_other_max_length_evaluate_identical_tokens(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    short = _data(_full_run(tiny_model_dir, tmp_path, max_length=6))
    long = _data(_full_run(tiny_model_dir, tmp_path, max_length=256))
    assert [e.input_ids for e in short.validation] == [
        e.input_ids for e in long.validation
    ]
    assert [e.labels for e in short.validation] == [e.labels for e in long.validation]
    # ... while their training samples are cut at their own lengths.
    assert max(len(e.input_ids) for e in short.train) <= 6
    assert max(len(e.input_ids) for e in long.train) > 6
    # Without a study-wide length, validation follows the training length (the old way).
    own = _data(_full_run(tiny_model_dir, tmp_path, max_length=6, eval_max_length=None))
    assert max(len(e.input_ids) for e in own.validation) <= 6
    assert max(len(e.input_ids) for e in long.validation) > 6
