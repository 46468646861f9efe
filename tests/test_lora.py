"""LoRA 'auto' targets: every linear projection of attention and MLP, for each architecture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from common.errors import BadInputError
from trainers.model.lora import apply_lora, load_base_model
from trainers.spec import LoraSpec
from trainers.tiny import build_tiny

EXPECTED = {
    "llama": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
    "qwen2": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
    "gpt_neox": {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"},
    "gpt2": {"c_attn", "c_proj", "c_fc"},  # transformers' Conv1D, not nn.Linear
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def arch_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    arch = request.param
    return arch, build_tiny(tmp_path_factory.mktemp(arch) / arch, arch=arch, size="xs")


def test_auto_targets_every_projection(arch_model: tuple[str, Path]) -> None:
    arch, path = arch_model
    model, info = apply_lora(load_base_model(str(path)), LoraSpec(r=4, alpha=8))
    assert set(info.lora_targets) == EXPECTED[arch]
    # Only adapter weights train; the output layer and embeddings stay frozen and unwrapped.
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert info.trainable_parameters == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert info.trainable_parameters == 4 * info.lora_parameters_per_rank
    assert 0 < info.trainable_parameters < info.total_parameters
    # A forward + backward pass reaches the adapters (Conv1D needs fan_in_fan_out on gpt2).
    ids = torch.randint(0, info.vocab_size, (2, 12))
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
    assert all(g is not None for g in grads)


def test_explicit_targets_and_unknown_names(arch_model: tuple[str, Path]) -> None:
    arch, path = arch_model
    name = sorted(EXPECTED[arch])[0]
    _, info = apply_lora(load_base_model(str(path)), LoraSpec(r=2, target_modules=(name,)))
    assert info.lora_targets == (name,)
    with pytest.raises(BadInputError, match="target_modules"):
        apply_lora(load_base_model(str(path)), LoraSpec(r=2, target_modules=("no_such_module",)))


def test_missing_model_folder_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="not found"):
        load_base_model(str(tmp_path / "nope"))
