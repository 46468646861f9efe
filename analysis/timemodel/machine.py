"""Describe this machine and a model for the time model, cheaply and the same way everywhere.

The study's estimator and `python -m analysis.calibrate` must compute the same fingerprint
for the same hardware + model, or a calibration would never be found again; both use these
functions.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from analysis.timemodel.hardware import HardwareInfo
from analysis.timemodel.model import ModelProfile
from common.errors import BadInputError


def this_machine(device: str = "auto", precision: str = "auto") -> HardwareInfo:
    """The device a run with these settings would train on (what `trainers.loop.run` picks).

    Raises:
        BadInputError: A device or precision this machine cannot provide.
    """
    from trainers.model.runtime import detect_runtime

    runtime = detect_runtime(device, precision, False)
    if runtime.device == "cpu":
        return HardwareInfo.this_cpu(precision=runtime.precision)
    host = HardwareInfo.this_cpu()
    if runtime.device == "cuda":
        import torch

        memory = int(torch.cuda.get_device_properties(0).total_memory)
        return HardwareInfo(
            "cuda", runtime.device_name, memory, os.cpu_count() or 1, runtime.precision
        )
    # MPS shares the host's memory.
    return HardwareInfo("mps", "Apple MPS", host.memory_bytes, host.cpu_cores, runtime.precision)


def model_profile(model_path: str | Path) -> ModelProfile:
    """Profile a local causal LM without loading its weights (see `config_profile`).

    Raises:
        BadInputError: Not a model folder transformers can read.
    """
    from transformers import AutoConfig

    path = Path(model_path)
    if not path.is_dir():
        raise BadInputError(f"model folder not found: {model_path}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecations inside transformers/PEFT
        try:
            config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise BadInputError(f"cannot read a causal LM config from {model_path}: {exc}") from exc
    return config_profile(config, source=str(model_path))


def config_profile(
    config: Any, *, source: str = "config", target_modules: str | tuple[str, ...] = "auto"
) -> ModelProfile:
    """Profile the causal LM a transformers config describes, without any weights.

    The model is built on PyTorch's meta device (shapes only, no memory) and wrapped with
    rank-1 LoRA adapters on the targets training uses, which counts the adapters' parameters
    per rank. A 7B model takes a second or two.

    Args:
        config: A ``PretrainedConfig`` (``AutoConfig.from_pretrained`` of a folder or file).
        source: Where the config came from, for the error message.
        target_modules: The LoRA targets counted ("auto": every linear projection).

    Raises:
        BadInputError: transformers cannot build a causal LM from the config.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from trainers.model.lora import apply_lora
    from trainers.spec import LoraSpec

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecations inside transformers/PEFT
        try:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise BadInputError(f"cannot build a causal LM from {source}: {exc}") from exc
        active = active_parameters(model)
        # Dropout changes no count, and LoRA on fused expert tensors admits none.
        _, info = apply_lora(model, LoraSpec(r=1, dropout=0.0, target_modules=target_modules))
    return ModelProfile(
        total_parameters=info.total_parameters - info.trainable_parameters,
        n_layers=info.n_layers,
        hidden_size=info.hidden_size,
        vocab_size=info.vocab_size,
        lora_parameters_per_rank=info.lora_parameters_per_rank,
        active_parameters=active,
    )


def active_parameters(model: Any) -> int:
    """The parameters one token runs through in a mixture of experts; 0 for a dense model.

    A token is routed to `num_experts_per_tok` of each layer's `num_local_experts` (or
    `num_experts`) experts, so that share of the expert weights (parameters under an
    `experts` module) is active, and everything else (attention, router, shared experts).
    """
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    experts = getattr(text, "num_local_experts", None) or getattr(text, "num_experts", None)
    per_token = getattr(text, "num_experts_per_tok", None)
    if not experts or not per_token:
        return 0
    total = sum(p.numel() for p in model.parameters())
    in_experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    return int(total - in_experts * (1.0 - per_token / experts)) if in_experts else 0


def profile_from_result(result: Mapping[str, Any]) -> ModelProfile:
    """The model profile of a trainer result dict (`TrainResult.to_dict()`).

    The trainer counts the adapters into `total_parameters`; the profile holds the base
    model's parameters alone, as `model_profile` does.
    """
    try:
        return ModelProfile(
            total_parameters=int(result["total_parameters"]) - int(result["trainable_parameters"]),
            n_layers=int(result["n_layers"]),
            hidden_size=int(result["hidden_size"]),
            vocab_size=int(result["vocab_size"]),
            lora_parameters_per_rank=int(result["lora_parameters_per_rank"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInputError(f"a training result lacks model fields: {exc!r}") from exc
