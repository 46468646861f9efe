"""Which device, precision and kernels a run uses, and why.

The choice is a pure function of what the machine offers so that the CUDA paths are
covered by tests on a CPU-only machine; `detect_runtime` feeds it the real answers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from common.errors import BadInputError

# The attention the trainer's models run: transformers' default, SDPA where the architecture
# has it (eager otherwise). flash_attention_2 is never requested: the flash-attn package is
# not a dependency. The time model reads `per_sample_attention` so that the two agree.
ATTENTION_KERNEL = "sdpa"


def per_sample_attention(kernel: str = ATTENTION_KERNEL) -> bool:
    """Whether a padding-free packed row's attention costs only each sample's own block.

    Only a varlen kernel (flash_attention_2 with the samples' offsets) skips the blocks
    between samples. SDPA and eager attention with the block-diagonal mask compute the whole
    row's scores and mask them: on an H100 (`benchmarks/gpu_scale.py`, 7-8B models, 2 x 2,048
    tokens) padding-free rows with SDPA ran 17-34 % slower per token than whole rows.
    """
    return kernel == "flash_attention_2"


@dataclass(frozen=True)
class RuntimeChoice:
    """The resolved device set-up of a run."""

    device: str  # "cpu" | "cuda" | "mps"
    precision: str  # "fp32" | "bf16" | "fp16"
    tf32: bool
    fused_adamw: bool
    pin_memory: bool
    compile: bool
    device_name: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def training_arguments(self) -> dict[str, Any]:
        """The `TrainingArguments` fields this choice sets."""
        return {
            "use_cpu": self.device == "cpu",
            "bf16": self.precision == "bf16",
            "fp16": self.precision == "fp16",  # Trainer adds the grad scaler for fp16
            "tf32": self.tf32 if self.device == "cuda" else None,
            "optim": "adamw_torch_fused" if self.fused_adamw else "adamw_torch",
            "dataloader_pin_memory": self.pin_memory,
            "torch_compile": self.compile,
        }


def choose_runtime(
    *,
    requested_device: str,
    requested_precision: str,
    compile: bool,
    cuda_available: bool,
    bf16_supported: bool,
    mps_available: bool,
    device_name: str = "",
) -> RuntimeChoice:
    """Resolve the device and precision of a run.

    Args:
        requested_device: "auto", "cpu", "cuda" or "mps".
        requested_precision: "auto", "fp32", "bf16" or "fp16".
        compile: whether the user asked for `torch.compile`.
        cuda_available: `torch.cuda.is_available()`.
        bf16_supported: `torch.cuda.is_bf16_supported()` (ignored without CUDA).
        mps_available: `torch.backends.mps.is_available()`.
        device_name: human-readable device name for the log.

    Raises:
        BadInputError: a device or precision the machine cannot provide.
    """
    if requested_device == "auto":
        device = "cuda" if cuda_available else "mps" if mps_available else "cpu"
    else:
        device = requested_device
    if device == "cuda" and not cuda_available:
        raise BadInputError("device=cuda was requested but no CUDA device is available")
    if device == "mps" and not mps_available:
        raise BadInputError("device=mps was requested but MPS is not available")

    cuda = device == "cuda"
    if cuda:
        precision = requested_precision
        if precision == "auto":
            precision = "bf16" if bf16_supported else "fp16"
        if precision == "bf16" and not bf16_supported:
            raise BadInputError(f"precision=bf16 is not supported on {device_name or 'this GPU'}")
        reason = (
            f"CUDA {device_name}: {precision} autocast"
            + (" with a grad scaler" if precision == "fp16" else "")
            + ", TF32 matmuls, fused AdamW, pinned memory"
            + (", torch.compile" if compile else "")
        )
    else:
        # CPU and MPS: mixed precision brings no speed on CPU and is unreliable on MPS.
        precision = "fp32" if requested_precision == "auto" else requested_precision
        if precision != "fp32":
            raise BadInputError(
                f"precision={precision} needs a CUDA device; {device} trains in fp32"
            )
        reason = f"{device}: fp32" + (" (torch.compile ignored off CUDA)" if compile else "")
    return RuntimeChoice(
        device=device,
        precision=precision,
        tf32=cuda,
        fused_adamw=cuda,
        pin_memory=cuda,
        compile=compile and cuda,  # pays off only on GPUs; on CPU it costs minutes of start-up
        device_name=device_name if cuda else device_name or device,
        reason=reason,
    )


def detect_runtime(requested_device: str, requested_precision: str, compile: bool) -> RuntimeChoice:
    """`choose_runtime` with the answers of the machine this process runs on."""
    import platform

    import torch

    cuda = torch.cuda.is_available()
    mps = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    name = torch.cuda.get_device_name(0) if cuda else platform.processor() or platform.machine()
    return choose_runtime(
        requested_device=requested_device,
        requested_precision=requested_precision,
        compile=compile,
        cuda_available=cuda,
        bf16_supported=cuda and torch.cuda.is_bf16_supported(),
        mps_available=mps,
        device_name=name,
    )
