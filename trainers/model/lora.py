"""Load a local causal LM and wrap it with PEFT LoRA adapters."""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any

from common.errors import BadInputError
from trainers.spec import LoraSpec

# PEFT's shorthand for "every nn.Linear / Conv1D except the output layer", found from the
# module tree; it covers fused projections (Phi-3's qkv_proj and gate_up_proj) and GPT-2's
# Conv1D. On a mixture of experts whose experts are fused 3-D parameters (transformers 5's
# Mixtral: experts.gate_up_proj [experts, 2 x intermediate, hidden] and experts.down_proj),
# PEFT targets those parameters too, and the router (gate.weight); gate_up_proj gets twice
# the rank, as the separate w1 and w3 of older checkpoints had one rank each.
AUTO_TARGETS = "all-linear"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelInfo:
    """What the time model needs to know about the wrapped model."""

    total_parameters: int
    trainable_parameters: int
    n_layers: int
    hidden_size: int
    vocab_size: int
    # Adapted modules by leaf name, e.g. ("q_proj", "v_proj"); an adapted parameter (a fused
    # expert tensor) as "module.parameter", e.g. "experts.down_proj".
    lora_targets: tuple[str, ...]
    lora_parameters_per_rank: int  # trainable LoRA parameters at rank 1


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
    """Wrap `model` with LoRA adapters and describe the result.

    PEFT's LoRA on a fused expert tensor has no dropout; with auto targets on such a model a
    dropout > 0 is dropped (with a warning) rather than failing every run that kept the
    default.
    """
    from peft import LoraConfig, get_peft_model

    auto = lora.target_modules == "auto"
    targets: str | list[str] = AUTO_TARGETS if auto else _as_list(lora.target_modules)
    dropout = lora.dropout
    if auto and dropout and _has_fused_experts(model):
        log.warning(
            "lora.dropout=%g is not possible on %s's fused expert parameters (PEFT's LoRA on "
            "parameters has no dropout): training with 0",
            dropout,
            model.config.model_type,
        )
        dropout = 0.0
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # PEFT annotates int; it scales by any number
        lora_dropout=dropout,
        use_rslora=lora.use_rslora,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # GPT-2's Conv1D: PEFT switches fan_in_fan_out on by itself and warns about it.
        warnings.filterwarnings("ignore", message=".*fan_in_fan_out.*")
        # Mixtral: PEFT's doubled rank for the fused w1/w3 names a module it then wraps.
        warnings.filterwarnings("ignore", message=".*_pattern keys did not match.*")
        try:
            peft_model = get_peft_model(model, config)
        except ValueError as exc:
            raise BadInputError(f"lora.target_modules: {exc}") from exc
    return peft_model, describe(peft_model)


def _has_fused_experts(model: Any) -> bool:
    """Whether the model keeps its experts as 3-D tensors (one slice per expert)."""
    return any(parameter.dim() == 3 for parameter in model.parameters())


def describe(peft_model: Any) -> ModelInfo:
    """Count parameters and list the adapted modules of a PEFT model."""
    import torch

    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(_weights_in(p) for p in peft_model.parameters())
    targets: set[str] = set()
    adapter = 0
    for name, module in peft_model.named_modules():
        lora_a = getattr(module, "lora_A", None)
        if isinstance(lora_a, torch.nn.ModuleDict) and "default" in lora_a:
            targets.add(_target_name(name, module))
            for part in (lora_a, module.lora_B):
                adapter += sum(p.numel() for p in part["default"].parameters())
    # Every adapter's rank is r times a constant (a rank_pattern doubles some), so the
    # parameters at rank r are r times those at rank 1.
    rank = int(peft_model.peft_config["default"].r)
    config = peft_model.get_base_model().config
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return ModelInfo(
        total_parameters=total,
        trainable_parameters=trainable,
        n_layers=int(getattr(text_config, "num_hidden_layers", 0) or text_config.n_layer),
        hidden_size=int(getattr(text_config, "hidden_size", 0) or text_config.n_embd),
        vocab_size=int(text_config.vocab_size),
        lora_targets=tuple(sorted(targets)),
        lora_parameters_per_rank=adapter // rank,
    )


def _target_name(name: str, module: Any) -> str:
    """The leaf name of an adapted module; "module.parameter" for an adapted parameter."""
    # PEFT nests one wrapper per adapted parameter of a module, each as the next one's
    # `base_layer`: the module's own name is the last part that is not "base_layer".
    parts = [part for part in name.split(".") if part != "base_layer"]
    parameter = getattr(module, "parameter_name", None)
    return f"{parts[-1]}.{parameter}" if parameter else parts[-1]


def _as_list(targets: str | tuple[str, ...]) -> list[str]:
    return [targets] if isinstance(targets, str) else list(targets)


def _weights_in(parameter: Any) -> int:
    """Weights a parameter holds: a 4-bit one (bitsandbytes) packs two per stored byte."""
    state = getattr(parameter, "quant_state", None)
    shape = getattr(state, "shape", None)
    return int(math.prod(shape)) if shape is not None else int(parameter.numel())
