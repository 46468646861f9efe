"""What a plan must know beyond batch and length: the setup choices that move time and memory.

Published LoRA tables differ by more than model, GPU, batch and length: the attention kernel
(eager attention stores every layer's score matrix, quadratic in length; SDPA and
FlashAttention-2 store none), the LoRA targets (attention only vs every linear projection:
a quarter of the step), the logits and loss in fp32 at large vocabularies (a 152k vocabulary
at 8,192 tokens is 4.6 GiB per fp32 copy), the allocator's reserved memory over what tensors
hold (what nvidia-smi and most tables report), and the length distribution (peak memory
follows the longest micro-batch, throughput the mean; micro-batches whose shapes change from
step to step leave the caching allocator holding blocks of several sizes). `RunSetup` carries them, and
`peak_memory` turns a plan plus a setup into peak bytes by part, with the memory terms
fitted to published runs (`analysis.priors.fit`).

Pure Python over the time model's types: no torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from analysis.timemodel.interconnect import DEFAULT_LINK, GRADIENT_BYTES, find_link
from analysis.timemodel.model import ModelProfile, Plan
from analysis.timemodel.workload import PRECISION_BYTES, weight_bytes
from common.errors import BadInputError
from trainers.spec import QUANTIZATION_MODES

ATTENTION_KERNELS = ("flash_attention_2", "sdpa", "eager")
MEMORY_MEASURES = ("allocated", "reserved")
# Bytes per trainable (LoRA) parameter: fp32 adapter, its fp32 gradient, AdamW's two moments.
TRAINABLE_BYTES = 16.0
# Eager attention keeps scores and softmax probabilities (16 bit) and a dropout mask per head:
# about 5 bytes per head per (query, key) pair (Korthikanti et al. 2022, eq. 2: 5as/h per token).
EAGER_SCORE_BYTES = 5.0
# Attention FLOPs cost this many times the rate of the weight matmuls: flash kernels fuse
# softmax and never write the scores; eager attention reads and writes them (memory bound).
ATTENTION_RATE = {"flash_attention_2": 1.0, "sdpa": 1.0, "eager": 2.0}


@dataclass(frozen=True)
class MemoryTerms:
    """The memory model's coefficients (fitted to published peaks; defaults: textbook values).

    Attributes:
        activation_scale: Multiplies 34 bytes per token x hidden per layer (16-bit
            activations of a transformer layer, Korthikanti et al. 2022).
        logits_fp32_bytes: Bytes per logit when logits are upcast to fp32 for the loss
            (16-bit logits + fp32 copy + fp32 gradient = 10).
        logits_16bit_bytes: Bytes per logit when the loss stays in 16 bit or is chunked.
        fixed_bytes: CUDA context, cuBLAS workspaces, the allocator's first blocks.
        reserved_over_allocated: Reserved (what nvidia-smi shows) / allocated at the peak.
        varied_length_reserve: Reserved memory the caching allocator keeps beyond the peak
            when unpacked samples of different lengths change the micro-batch's shape from
            step to step, per byte of what changes shape (activations and logits): blocks cut
            for one shape are not reused whole for a larger one, so a second set is reserved.
            0 for whole or packed rows, and for the "allocated" measure.
        log_p90: log(p90 / p50) of the peak: the largest under-prediction among the fitted
            published peaks, so that p90 holds every one of them.
    """

    activation_scale: float = 1.0
    logits_fp32_bytes: float = 10.0
    logits_16bit_bytes: float = 4.0
    fixed_bytes: float = 0.5 * 2**30
    reserved_over_allocated: float = 1.1
    varied_length_reserve: float = 0.0
    log_p90: float = 0.10

    def to_dict(self) -> dict[str, float]:
        """Return a JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class RunSetup:
    """Setup choices of a run that a batch shape alone does not say.

    Attributes:
        attention: "flash_attention_2", "sdpa" (transformers' default) or "eager".
        lora_targets: "all-linear" (what this project trains) or module names,
            e.g. ("q_proj", "v_proj").
        logits_fp32: The loss upcasts the whole logits tensor to fp32 (transformers does;
            chunked losses such as torchtune's and Liger's do not).
        memory_measure: "reserved" (nvidia-smi, torch.cuda.max_memory_reserved) or
            "allocated" (torch.cuda.max_memory_allocated): what the peak is compared with.
        longest_sample: Tokens of the longest sample (peak memory follows the longest
            micro-batch); None: max_length, the safe bound.
        packing: Samples are packed into full max_length rows (no padding, every row full).
        group_by_length: Samples kept apart, each micro-batch of samples of about one
            length (transformers' length-grouped sampler); ignored when packed.
        lengths_vary: The samples are not all of one length, so an unpacked micro-batch's
            shape changes from step to step (`MemoryTerms.varied_length_reserve`); ignored
            when packed (every row is max_length).
        quantization: "none", or "nf4": the base's linear layers in 4 bits (QLoRA).
        interconnect: The link between the GPUs of a data-parallel run
            (`analysis.timemodel.interconnect.LINKS`).
    """

    attention: str = "sdpa"
    lora_targets: str | tuple[str, ...] = "all-linear"
    logits_fp32: bool = True
    memory_measure: str = "reserved"
    longest_sample: int | None = None
    packing: bool = False
    group_by_length: bool = False
    lengths_vary: bool = False
    quantization: str = "none"
    interconnect: str = DEFAULT_LINK

    def __post_init__(self) -> None:
        find_link(self.interconnect)
        if self.quantization not in QUANTIZATION_MODES:
            raise BadInputError(
                f"--quantization must be one of {', '.join(QUANTIZATION_MODES)}, "
                f"but got {self.quantization!r}"
            )
        if self.attention not in ATTENTION_KERNELS:
            raise BadInputError(
                f"--attention must be one of {', '.join(ATTENTION_KERNELS)}, but got {self.attention!r}"
            )
        if self.memory_measure not in MEMORY_MEASURES:
            raise BadInputError(
                f"--memory-measure must be one of {', '.join(MEMORY_MEASURES)}, "
                f"but got {self.memory_measure!r}"
            )
        if self.longest_sample is not None and self.longest_sample < 1:
            raise BadInputError(f"--longest-sample must be >= 1, but got {self.longest_sample}")
        if isinstance(self.lora_targets, str) and self.lora_targets != "all-linear":
            names = tuple(n.strip() for n in self.lora_targets.split(",") if n.strip())
            if not names:
                raise BadInputError(f"--lora-targets: no module names in {self.lora_targets!r}")
            object.__setattr__(self, "lora_targets", names)

    @property
    def peft_targets(self) -> str | tuple[str, ...]:
        """The targets as `trainers.spec.LoraSpec.target_modules` takes them."""
        return "auto" if self.lora_targets == "all-linear" else self.lora_targets

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        data = asdict(self)
        if isinstance(self.lora_targets, tuple):
            data["lora_targets"] = list(self.lora_targets)
        return data


def longest_of(plan: Plan, setup: RunSetup) -> int:
    """Tokens of the longest micro-batch row: max_length when packed or unknown."""
    if setup.packing or setup.longest_sample is None:
        return plan.max_length
    return min(setup.longest_sample, plan.max_length)


def memory_parts(
    plan: Plan, setup: RunSetup, terms: MemoryTerms, *, model: ModelProfile | None = None
) -> dict[str, float]:
    """Peak allocated bytes by part (the reserved overhead is a part of its own).

    Args:
        plan: The run (its model, micro-batch, precision, checkpointing, rank).
        setup: Attention kernel, logits precision, longest sample, memory measure.
        terms: The memory coefficients.
        model: Instead of the plan's model (the same model with other LoRA targets).
    """
    model = model or plan.model
    width = PRECISION_BYTES[plan.precision]
    rows, length = plan.micro_batch_size, longest_of(plan, setup)
    tokens = rows * length
    per_layer = terms.activation_scale * 17.0 * width * tokens * model.hidden_size
    if setup.attention == "eager":
        heads = max(model.hidden_size / 64.0, 1.0)
        per_layer += EAGER_SCORE_BYTES * heads * rows * length**2
    if plan.gradient_checkpointing:
        # Each layer's input is kept; one layer's activations exist again during recompute.
        activations = model.n_layers * tokens * model.hidden_size * width + per_layer
    else:
        activations = model.n_layers * per_layer
    logit_bytes = terms.logits_fp32_bytes if setup.logits_fp32 else terms.logits_16bit_bytes
    parts = {
        "weights": weight_bytes(model, plan.precision, plan.quantization),
        "lora_state": TRAINABLE_BYTES * plan.lora_r * model.lora_parameters_per_rank,
        "activations": activations,
        "logits": logit_bytes * tokens * model.vocab_size,
        "runtime_overhead": terms.fixed_bytes,
        # DDP's gradient buckets on each GPU of a data-parallel run: the adapter's gradients again.
        "ddp_buckets": float(GRADIENT_BYTES * plan.trainable_parameters) if plan.gpus > 1 else 0.0,
    }
    allocated = sum(parts.values())
    reserved = setup.memory_measure == "reserved"
    overhead = terms.reserved_over_allocated if reserved else 1.0
    parts["allocator_reserve"] = allocated * (overhead - 1.0)
    varied = reserved and setup.lengths_vary and not setup.packing
    shaped = parts["activations"] + parts["logits"]
    parts["varied_length_reserve"] = terms.varied_length_reserve * shaped if varied else 0.0
    return parts


def peak_memory(
    plan: Plan, setup: RunSetup, terms: MemoryTerms, *, model: ModelProfile | None = None
) -> tuple[float, float]:
    """Peak memory p50 and p90 in bytes, in the setup's measure (reserved or allocated)."""
    p50 = sum(memory_parts(plan, setup, terms, model=model).values())
    return p50, p50 * math.exp(max(terms.log_p90, 0.0))
