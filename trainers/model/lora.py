"""Load a local causal LM and wrap it with PEFT LoRA adapters."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from common.errors import BadInputError
from trainers.spec import LoraSpec

# PEFT's shorthand for "every nn.Linear / Conv1D except the output layer", found from the
# module tree; it covers fused projections (qkv_proj, gate_up_proj) and GPT-2's Conv1D.
AUTO_TARGETS = "all-linear"


@dataclass(frozen=True)
class ModelInfo:
    """What the time model needs to know about the wrapped model."""

    total_parameters: int
    trainable_parameters: int
    n_layers: int
    hidden_size: int
    vocab_size: int
    lora_targets: tuple[str, ...]  # resolved module names (leaf names), e.g. ("q_proj", "v_proj")
    lora_parameters_per_rank: int  # sum of in + out features over adapted modules


def load_base_model(path: str, *, dtype: Any = None) -> Any:
    """Load a causal LM from a local folder (no hub access)."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    if not Path(path).is_dir():
        raise BadInputError(f"model folder not found: {path}")
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise BadInputError(f"cannot load a causal LM from {path}: {exc}") from exc


def load_tokenizer(path: str) -> Any:
    """Load the tokenizer saved beside a local model; pad with eos when it has no pad token."""
    from pathlib import Path

    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise BadInputError(f"model folder not found: {path}")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def apply_lora(model: Any, lora: LoraSpec) -> tuple[Any, ModelInfo]:
    """Wrap `model` with LoRA adapters and describe the result."""
    from peft import LoraConfig, get_peft_model

    targets: str | list[str] = (
        AUTO_TARGETS if lora.target_modules == "auto" else _as_list(lora.target_modules)
    )
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # PEFT annotates int; it scales by any number
        lora_dropout=lora.dropout,
        use_rslora=lora.use_rslora,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # GPT-2's Conv1D: PEFT switches fan_in_fan_out on by itself and warns about it.
        warnings.filterwarnings("ignore", message=".*fan_in_fan_out.*")
        try:
            peft_model = get_peft_model(model, config)
        except ValueError as exc:
            raise BadInputError(f"lora.target_modules: {exc}") from exc
    return peft_model, describe(peft_model)


def describe(peft_model: Any) -> ModelInfo:
    """Count parameters and list the adapted modules of a PEFT model."""
    import torch

    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in peft_model.parameters())
    leaf_names: set[str] = set()
    per_rank = 0
    for name, module in peft_model.named_modules():
        lora_a = getattr(module, "lora_A", None)
        if isinstance(lora_a, torch.nn.ModuleDict) and "default" in lora_a:
            leaf_names.add(name.rsplit(".", 1)[-1])
            per_rank += int(module.in_features) + int(module.out_features)
    config = peft_model.get_base_model().config
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return ModelInfo(
        total_parameters=total,
        trainable_parameters=trainable,
        n_layers=int(getattr(text_config, "num_hidden_layers", 0) or text_config.n_layer),
        hidden_size=int(getattr(text_config, "hidden_size", 0) or text_config.n_embd),
        vocab_size=int(text_config.vocab_size),
        lora_targets=tuple(sorted(leaf_names)),
        lora_parameters_per_rank=per_rank,
    )


def _as_list(targets: str | tuple[str, ...]) -> list[str]:
    return [targets] if isinstance(targets, str) else list(targets)
