"""A worker's trials share one base model: reuse changes nothing but time.

Real runs of the tiny llama through `trainers.loop.run.train`; the fresh-process reference
runs in a new Python process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from trainers.data.paths import demo_data_path
from trainers.loop.inputs import RunInputs
from trainers.loop.run import train
from trainers.spec import LoraSpec, TrainSpec

ROOT = Path(__file__).resolve().parents[1]


def _spec(model: Path, tmp_path: Path, name: str, **overrides: Any) -> TrainSpec:
    values: dict[str, Any] = {
        "model": str(model),
        "data": str(demo_data_path("prompt_completion")),
        "output_dir": str(tmp_path / name),
        "lora": LoraSpec(r=8, alpha=16, dropout=0.1),
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "learning_rate": 3e-3,
        "warmup_ratio": 0.1,
        "epochs": 1,
        "stop_after_steps": 6,
        "eval_interval": 3,
        "eval_samples": 12,
        "max_length": 96,
        "eval_max_length": 128,
        "checkpoint_interval": 0,
        "cache_dir": str(tmp_path / "cache"),
    }
    values.update(overrides)
    return TrainSpec(**values)


def _digest(model: Any) -> str:
    """A hash of every tensor of the model's state, names included."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _losses(result: Any) -> dict[str, list[list[float]]]:
    return {"train": result.train_losses, "eval": result.eval_losses}


_FRESH = """
import dataclasses, json, sys
from trainers.loop.run import train
from trainers.spec import LoraSpec, TrainSpec
values = json.loads(sys.argv[1])
values["lora"] = LoraSpec(**values["lora"])
result = train(TrainSpec(**values))
print(json.dumps({"train": result.train_losses, "eval": result.eval_losses}))
"""


def _in_fresh_process(spec: TrainSpec) -> dict[str, list[list[float]]]:
    values = dataclasses.asdict(spec)
    done = subprocess.run(
        [sys.executable, "-c", _FRESH, json.dumps(values)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _assert_close(a: dict[str, list[list[float]]], b: dict[str, list[list[float]]]) -> None:
    for key in ("train", "eval"):
        assert [s for s, _ in a[key]] == [s for s, _ in b[key]], key
        for (_, x), (_, y) in zip(a[key], b[key], strict=True):
            assert abs(x - y) <= 1e-5, (key, x, y)


def test_reused_base_is_bit_identical_and_losses_equal_a_fresh_process(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    inputs = RunInputs()
    first = _spec(tiny_model_dir, tmp_path, "a", lora=LoraSpec(r=4, alpha=8, dropout=0.0))
    # The second trial differs in everything a trial may change on the model: rank,
    # dropout, gradient checkpointing, batch.
    second = _spec(
        tiny_model_dir,
        tmp_path,
        "b",
        lora=LoraSpec(r=16, alpha=8, dropout=0.1),
        gradient_checkpointing=True,
        micro_batch_size=2,
        gradient_accumulation_steps=3,
    )
    loaded_run = train(first, inputs=inputs)
    base = inputs._base
    loaded = _digest(base)
    config = base.config.to_dict()
    reused = train(second, inputs=inputs)
    assert inputs.loads == 1  # the second trial did not load the model again
    assert not loaded_run.reused_base_model and reused.reused_base_model
    # The time model learns start-up only from runs that loaded their model, as a full run does.
    from analysis.calibration.measurements import RunMeasurements

    assert RunMeasurements.from_result_dict(loaded_run.to_dict()).startup_seconds > 0
    assert RunMeasurements.from_result_dict(reused.to_dict()).startup_seconds == 0
    assert inputs._base is base
    assert _digest(base) == loaded  # bit-identical weights
    assert base.config.to_dict() == config
    assert not base.training and not any(m.training for m in base.modules())
    assert all(p.requires_grad for p in base.parameters())  # as loaded
    # transformers 5.17 (the GPU image's) names it is_gradient_checkpointing, 5.24 both
    name = "is_activation_checkpointing"
    assert not getattr(base, name if hasattr(base, name) else "is_gradient_checkpointing")
    assert not hasattr(base, "peft_config")
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in base.modules())
    assert not any("lora" in name for name, _ in base.named_modules())
    _assert_close(_losses(reused), _in_fresh_process(second))


def test_eval_loss_does_not_depend_on_the_micro_batch(tiny_model_dir: Path, tmp_path: Path) -> None:
    # A learning rate of 1e-12: the adapter stays at its initial (zero) update, so every
    # evaluation scores the base model on the same samples; only the batching differs.
    runs = [
        train(
            _spec(
                tiny_model_dir,
                tmp_path,
                f"mb{mb}",
                micro_batch_size=mb,
                gradient_accumulation_steps=1,
                learning_rate=1e-12,
                stop_after_steps=1,
                eval_interval=1,
            )
        )
        for mb in (1, 5)
    ]
    losses = [run.eval_losses[-1][1] for run in runs]
    assert abs(losses[0] - losses[1]) <= 1e-5, losses


def test_another_model_reloads_and_says_so(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from trainers.tiny import build_tiny

    other = build_tiny(tmp_path / "gpt2-xs", arch="gpt2", size="xs")
    inputs = RunInputs()
    spec = _spec(tiny_model_dir, tmp_path, "one", stop_after_steps=1, eval_interval=1)
    try:
        inputs.attach(spec, "cpu")
        inputs.release()
        first = inputs._base
        with caplog.at_level(logging.INFO, logger="trainers.loop.inputs"):
            attached = inputs.attach(dataclasses.replace(spec, model=str(other)), "cpu")
        assert attached.model.get_base_model() is not first
        assert attached.model.config.model_type == "gpt2"
        assert inputs.loads == 2
        assert "reloading the base model (path" in caplog.text
        with pytest.raises(RuntimeError, match="still attached"):
            inputs.attach(spec, "cpu")
    finally:
        inputs.release()


def test_a_failed_run_releases_its_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    from trainers.events import StepInfo, TrainingCallback

    class Boom(TrainingCallback):
        def on_step(self, info: StepInfo) -> bool:
            raise RuntimeError("boom")

    inputs = RunInputs()
    with pytest.raises(RuntimeError, match="boom"):
        train(_spec(tiny_model_dir, tmp_path, "boom"), [Boom()], inputs=inputs)
    assert inputs._attached is None
    assert not any("lora" in name for name, _ in inputs._base.named_modules())
    # ... and the next run attaches to the same base.
    result = train(_spec(tiny_model_dir, tmp_path, "next", stop_after_steps=1), inputs=inputs)
    assert inputs.loads == 1 and result.optimizer_steps == 1
    assert torch.isfinite(torch.tensor(result.eval_losses[-1][1]))
