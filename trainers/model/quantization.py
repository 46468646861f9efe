"""QLoRA: a 4-bit (NF4) base model under the LoRA adapters, through bitsandbytes.

``quantization="nf4"`` loads the base model's linear layers as bitsandbytes ``Linear4bit``
(NormalFloat4, double quantization of the block constants; Dettmers et al. 2023, "QLoRA:
Efficient Finetuning of Quantized LLMs"), computing in the run's precision (bf16 on a recent
GPU, fp32 on a CPU), and prepares it with PEFT's ``prepare_model_for_kbit_training`` (base
frozen, the remaining 16-bit parameters in fp32). Embeddings and the output head stay
unquantized. The adapters are trained and saved as usual; a checkpoint holds only them.

bitsandbytes is optional (``pip install 'hpo[qlora]'``); without it a run asking for nf4
stops with a one-line error. Since 0.49 it runs 4-bit layers on a CPU too (checked on this
project's 2-core x86 VMs with bitsandbytes 0.50.2: a tiny model's loss falls).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from common.errors import BadInputError

# bitsandbytes' fast CPU inference path (AVX512-BF16, taken in eval mode) repacks each
# weight in blocks of 32 output rows with one quantization block (64 inputs) per row
# segment, and fails on other shapes; real models' widths are multiples of both, tiny test
# models' are not.
_CPU_PACK_ROWS = 32
_QUANT_BLOCK = 64


def compute_dtype(precision: str) -> Any:
    """The torch dtype the 4-bit layers compute in, for the run's resolved precision."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)


def require_bitsandbytes() -> None:
    """Raise a one-line BadInputError when bitsandbytes is not installed."""
    if importlib.util.find_spec("bitsandbytes") is None:
        raise BadInputError(
            "quantization='nf4' needs bitsandbytes: pip install 'hpo[qlora]' "
            "(or run with quantization=none)"
        )


def nf4_config(precision: str) -> Any:
    """transformers' ``BitsAndBytesConfig`` for NF4 with double quantization."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype(precision),
    )


def load_quantized(path: str, *, device: str, precision: str) -> Any:
    """Load a causal LM from a local folder with NF4 linear layers on `device`, prepared."""
    from pathlib import Path

    if not Path(path).is_dir():
        raise BadInputError(f"model folder not found: {path}")
    require_bitsandbytes()
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            path,
            quantization_config=nf4_config(precision),
            device_map={"": device},
            local_files_only=True,
        )
    except (OSError, ValueError) as exc:
        raise BadInputError(f"cannot load {path} in 4 bits: {exc}") from exc
    # Checkpointing is the Trainer's business (TrainingArguments), as for a 16-bit base.
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    _avoid_cpu_repacking(model)
    return model


def _avoid_cpu_repacking(model: Any) -> None:
    """Turn off bitsandbytes' CPU inference repacking on layers it cannot repack."""
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit) and (
            module.out_features % _CPU_PACK_ROWS or module.in_features % _QUANT_BLOCK
        ):
            module.support_avx512bf16_for_cpu = False
