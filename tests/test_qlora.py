"""QLoRA: a 4-bit NF4 base (bitsandbytes) under the adapters, trained for real on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from common.errors import BadInputError
from tests.configs import demo_spec
from trainers.loop.inputs import RunInputs
from trainers.loop.run import train
from trainers.loop.trainer_setup import PadCollator
from trainers.spec import LoraSpec, TrainSpec


def test_quantization_is_checked(tiny_model_dir: Path) -> None:
    with pytest.raises(BadInputError, match="quantization"):
        TrainSpec(model=str(tiny_model_dir), data="x.jsonl", quantization="int3")


def _spec(model: Path, tmp: Path, **changes: object) -> TrainSpec:
    values: dict[str, object] = {
        "lora": LoraSpec(r=8, alpha=16, dropout=0.0),
        "micro_batch_size": 4,
        "learning_rate": 2e-2,
        "max_steps": 5,
        "eval_interval": 0,
        "eval_samples": 8,
        "checkpoint_interval": 5,
        "quantization": "nf4",
    }
    return demo_spec(model, tmp, **{**values, **changes})


def test_nf4_run_trains_saves_and_reloads(tiny_model_dir: Path, tmp_path: Path) -> None:
    bnb = pytest.importorskip("bitsandbytes")
    from peft import PeftModel

    from trainers.model.quantization import load_quantized

    inputs = RunInputs(keep_base=True)
    spec = _spec(tiny_model_dir, tmp_path)
    result = train(spec, inputs=inputs)
    base = inputs._base
    four_bit = [m for m in base.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(four_bit) >= 7 * 2  # every projection of both blocks
    assert all(m.weight.dtype == torch.uint8 for m in four_bit)  # packed 4-bit values
    assert result.final_eval_loss is not None

    # The checkpoint holds the adapter only; on a freshly quantized base it scores the
    # validation samples as the run did at its end.
    checkpoint = Path(str(result.checkpoint_dir))
    config = json.loads((checkpoint / "adapter_config.json").read_text())
    assert config["r"] == 8
    reloaded = PeftModel.from_pretrained(
        load_quantized(str(tiny_model_dir), device="cpu", precision="fp32"), str(checkpoint)
    ).eval()
    attached = inputs.attach(spec, "cpu")  # the same tokenized data
    pad = PadCollator(int(attached.tokenizer.pad_token_id))
    batch = pad(attached.data.validation[: spec.eval_samples])
    inputs.release()
    with torch.no_grad():
        loss = float(reloaded(**batch).loss)
        with reloaded.disable_adapter():
            untrained = float(reloaded(**batch).loss)
    # Not bit-equal: the run scores longest-first batches, and bitsandbytes' CPU kernels
    # round differently per batch shape (seen: 1.3e-4 relative).
    assert loss == pytest.approx(result.final_eval_loss, rel=1e-3)
    assert loss < untrained - 0.3  # the adapter learned

    # A worker keeps the 4-bit base for 4-bit runs and reloads for a 16-bit one.
    train(_spec(tiny_model_dir, tmp_path, output_dir=str(tmp_path / "b"), max_steps=1,
                checkpoint_interval=0), inputs=inputs)  # fmt: skip
    assert inputs.loads == 1
    plain = train(_spec(tiny_model_dir, tmp_path, output_dir=str(tmp_path / "c"), max_steps=1,
                        checkpoint_interval=0, quantization="none"), inputs=inputs)  # fmt: skip
    assert inputs.loads == 2
    # The time model counts the base's weights, not their packed 4-bit storage.
    assert result.total_parameters == plain.total_parameters


def test_nf4_weight_term_holds_a_loaded_4bit_base_at_16_bit_training(tiny_model_dir: Path) -> None:
    """Whatever the training precision, kbit preparation leaves the unquantized parameters
    (embeddings, head, norms) in fp32: the plan's weight term must hold what is loaded."""
    pytest.importorskip("bitsandbytes")
    from analysis.timemodel.machine import model_profile
    from analysis.timemodel.workload import weight_bytes
    from trainers.model.quantization import load_quantized

    model = load_quantized(str(tiny_model_dir), device="cpu", precision="bf16")
    loaded = sum(p.numel() * p.element_size() for p in model.parameters())
    fp32 = sum(p.numel() * 4 for p in model.parameters() if p.dtype == torch.float32)
    assert fp32 > loaded / 2  # a tiny model is mostly embeddings: the term that was short
    profile = model_profile(str(tiny_model_dir))
    predicted = weight_bytes(profile, "bf16", "nf4")
    assert loaded <= predicted
    # An upper bound, not a loose one: the head, counted untied, is the only slack (the tiny
    # model ties it to the embedding), with NF4's constants a few bytes either way.
    head = profile.vocab_size * profile.hidden_size * 4
    assert predicted - loaded <= head * 1.02
