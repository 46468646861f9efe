"""Every micro-step trains in training mode: gradient checkpointing recomputes, dropout drops.

A regression seen on an H100 (`benchmarks/gpu_scale.py`): the trainer skipped `model.train()`
when the PEFT wrapper already said `training`, but the base under it was loaded in eval mode,
so until the first evaluation no layer trained in training mode. Gradient checkpointing then
saved nothing (a 7B run at 8 x 1,024 tokens took 70 GiB, as without it) and LoRA dropout never
dropped. Real runs of the tiny llama through `trainers.loop.run.train`; each MLP call is
counted with the mode it ran in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers.models.llama import modeling_llama

from trainers.loop.run import train
from trainers.spec import LoraSpec, TrainSpec

STEPS, ACCUMULATION = 3, 2


def _run(model: Path, data: Path, tmp_path: Path, name: str, **overrides: Any) -> list[bool]:
    """Train; return the `training` flag of every MLP call during the optimizer steps."""
    calls: list[bool] = []
    forward = modeling_llama.LlamaMLP.forward

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(self.training)
        return forward(self, *args, **kwargs)

    spec = TrainSpec(
        model=str(model), data=str(data), output_dir=str(tmp_path / name),
        lora=LoraSpec(r=4, alpha=8, dropout=0.0), micro_batch_size=2,
        gradient_accumulation_steps=ACCUMULATION, max_steps=STEPS, max_length=64,
        eval_interval=0, eval_samples=2, checkpoint_interval=0,
        cache_dir=str(tmp_path / "cache"), **overrides,
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modeling_llama.LlamaMLP, "forward", counted)
        train(spec)
    return calls


def test_layers_train_in_training_mode_and_checkpointing_recomputes(
    tiny_model_dir: Path, small_data: Path, tmp_path: Path
) -> None:
    import json

    layers = json.loads((tiny_model_dir / "config.json").read_text())["num_hidden_layers"]
    forwards = STEPS * ACCUMULATION * layers  # one MLP call per layer per micro-step

    plain = _run(tiny_model_dir, small_data, tmp_path, "plain")
    # Every training forward in training mode; the final evaluation's in eval mode.
    assert plain.count(True) == forwards, plain
    assert plain.count(False) >= layers

    checkpointed = _run(tiny_model_dir, small_data, tmp_path, "gc", gradient_checkpointing=True)
    # The backward pass runs every layer's forward again.
    assert checkpointed.count(True) == 2 * forwards, checkpointed
    assert checkpointed.count(False) == plain.count(False)
