"""Predict the duration, cost and peak memory of a full LoRA fine-tuning run.

Full-run seconds = start-up + data loading + warm-up + optimizer steps x (accumulation x
(micro-step time + loop overhead) + optimizer-step time) + evaluations + checkpoint saves.
Every term is a small linear model over physical features (FLOPs of the frozen weights and
of the adapters, attention, parameters, tokens) whose coefficients are either priors from
the device's peak FLOP/s or fitted to measured steps (`analysis.calibration`).

Pure numpy (and the step count of `trainers.spec`): importable without torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from common.config import require
from common.errors import BadInputError
from trainers.data.packing import pack_lengths
from trainers.spec import PACKING_MODES, QUANTIZATION_MODES, eval_batch_size, optimizer_steps

DEVICE_KINDS = ("cpu", "cuda", "mps")
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
Z90 = 1.2815515655446004  # standard normal quantile of 0.9
BAND_PARTS = ("model", "drift", "step_noise", "total")  # see `interval_components`

# Dense peak FLOP/s (half precision tensor cores, fp32 without TF32), from vendor data sheets.
# More specific names come first so that "A100" is not taken for "A10", "L40S" for "L4" and
# an H100 PCIe (lower clocks and power) for the SXM part.
_GPU_PEAKS: tuple[tuple[str, float, float], ...] = (
    ("H200", 989e12, 67e12),
    ("H100 PCIE", 756e12, 51e12),
    ("H100 NVL", 835e12, 60e12),
    ("H100", 989e12, 67e12),
    ("A100", 312e12, 19.5e12),
    ("L40S", 362e12, 91.6e12),
    ("L40", 181e12, 90.5e12),
    ("L4", 121e12, 30.3e12),
    ("A10G", 125e12, 31.2e12),
    ("4090", 165e12, 82.6e12),
    ("A6000", 154.8e12, 38.7e12),
    ("V100", 125e12, 15.7e12),  # fp16; bf16 is emulated on V100 and slower still
    ("T4", 65e12, 8.1e12),
)
_UNKNOWN_GPU_PEAK = (30e12, 10e12)  # conservative: an unknown GPU is assumed slow
_MPS_PEAK = (10e12, 5e12)
_GPU_UTILISATION = 0.35
_CPU_UTILISATION = 0.5  # of the measured matmul probe
# Uncalibrated estimates are off by up to 2-3x in practice, so the prior band is wide.
_PRIOR_LOG_P10 = math.log(0.6)
_PRIOR_LOG_P90 = math.log(1.8)
# Peak memory of an uncalibrated plan: the activation formula is a textbook estimate, so its
# p90 sits 10 % above the median; a calibration narrows that to what its runs show.
_PRIOR_MEMORY_LOG_P90 = math.log(1.10)


@dataclass(frozen=True)
class ModelProfile:
    """What the model looks like, filled from the real module tree by the trainer side.

    Attributes:
        total_parameters: All parameters of the base model (frozen ones included).
        n_layers: Transformer blocks.
        hidden_size: Width of the residual stream.
        vocab_size: Rows of the output embedding (logits memory).
        lora_parameters_per_rank: Trainable LoRA parameters at rank 1 (sum over target
            modules of in + out features); rank r trains r times as many.
        active_parameters: The frozen parameters one token's forward pass multiplies by: a
            mixture of experts runs only some of its experts per token. 0: all of
            `total_parameters` (a dense model).
    """

    total_parameters: int
    n_layers: int
    hidden_size: int
    vocab_size: int
    lora_parameters_per_rank: int
    active_parameters: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "active_parameters":
                require(
                    0 <= value <= self.total_parameters,
                    f"ModelProfile.active_parameters must be in [0, total_parameters] but got {value=}",
                )
            else:
                require(value > 0, f"ModelProfile.{f.name} must be > 0 but got {value=}")

    @property
    def compute_parameters(self) -> int:
        """The parameters a token's matmuls run through (the active ones of a mixture)."""
        return self.active_parameters or self.total_parameters


@dataclass(frozen=True)
class HardwareInfo:
    """The machine a run executes on.

    Attributes:
        device_kind: "cpu", "cuda" or "mps".
        device_name: GPU name (e.g. "NVIDIA H100 80GB HBM3") or CPU model string.
        memory_bytes: Device memory (host memory on CPU).
        cpu_cores: Logical CPU cores available to the run.
        precision: Training precision, "fp32", "bf16" or "fp16".
    """

    device_kind: str
    device_name: str
    memory_bytes: int
    cpu_cores: int
    precision: str = "fp32"

    def __post_init__(self) -> None:
        kind, precision = self.device_kind, self.precision
        require(kind in DEVICE_KINDS, f"device_kind must be one of {DEVICE_KINDS} but got {kind=}")
        require(
            precision in PRECISION_BYTES,
            f"precision must be one of {tuple(PRECISION_BYTES)} but got {precision=}",
        )

    @classmethod
    def this_cpu(cls, *, precision: str = "fp32") -> HardwareInfo:
        """Describe this machine's CPU from the standard library alone."""
        name = "cpu"
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as handle:
                for line in handle:
                    if line.startswith("model name"):
                        name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            memory = 0
        return cls("cpu", name, int(memory), os.cpu_count() or 1, precision)


def fingerprint(hardware: HardwareInfo, model: ModelProfile) -> str:
    """Return a stable short hash naming a hardware + model combination.

    The hostname is left out on purpose: identical machines share a calibration. On CPU the
    core count is part of it because step time scales with the threads available.
    """
    key = {
        "device_kind": hardware.device_kind,
        "device_name": hardware.device_name.strip().lower(),
        "precision": hardware.precision,
        "cpu_cores": hardware.cpu_cores if hardware.device_kind == "cpu" else None,
        "total_parameters": model.total_parameters,
        "n_layers": model.n_layers,
        "hidden_size": model.hidden_size,
    }
    if model.active_parameters:  # only a mixture of experts: dense fingerprints stay as they were
        key["active_parameters"] = model.active_parameters
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Plan:
    """The full run a trial's configuration would become.

    Attributes:
        model: The model being fine-tuned.
        token_lengths: Per-sample token lengths of the training set (after truncation).
        epochs: Passes over the training set (ignored when `max_steps` is set).
        micro_batch_size: Samples per forward/backward pass.
        gradient_accumulation_steps: Micro-steps per optimizer step.
        max_length: Truncation length in tokens.
        lora_r: LoRA rank.
        eval_interval_steps: Optimizer steps between evaluations; 0 = none.
        eval_samples: Samples per evaluation.
        checkpoint_interval_steps: Optimizer steps between checkpoint saves; 0 = none.
        gradient_checkpointing: Recompute activations in the backward pass.
        precision: "fp32", "bf16" or "fp16".
        device_kind: "cpu", "cuda" or "mps".
        max_steps: Optimizer steps; overrides `epochs` when set.
        packing: "none", or "padding_free": samples packed into sequences of at most
            `max_length` tokens (`trainers.data.packing`); `micro_batch_size` then counts
            sequences, each micro-batch is one row without padding.
        quantization: "none", or "nf4": the base's linear layers in 4 bits (QLoRA,
            `trainers.model.quantization`): `weight_bytes` and `NF4_STEP_FACTOR`.
    """

    model: ModelProfile
    token_lengths: tuple[int, ...]
    epochs: float
    micro_batch_size: int
    gradient_accumulation_steps: int
    max_length: int
    lora_r: int
    eval_interval_steps: int
    eval_samples: int
    checkpoint_interval_steps: int
    gradient_checkpointing: bool = False
    precision: str = "fp32"
    device_kind: str = "cpu"
    max_steps: int | None = None
    packing: str = "none"
    quantization: str = "none"

    def __post_init__(self) -> None:
        require(
            self.quantization in QUANTIZATION_MODES,
            f"quantization must be one of {QUANTIZATION_MODES} "
            f"but got quantization={self.quantization!r}",
        )
        require(
            self.packing in PACKING_MODES,
            f"packing must be one of {PACKING_MODES} but got packing={self.packing!r}",
        )
        require(len(self.token_lengths) > 0, "token_lengths must not be empty")
        shortest = min(self.token_lengths)
        require(shortest > 0, f"token_lengths must all be > 0 but got {shortest=}")
        for name in ("micro_batch_size", "gradient_accumulation_steps", "max_length", "lora_r"):
            value = getattr(self, name)
            require(value >= 1, f"{name} must be >= 1 but got {value=}")
        for name in ("eval_interval_steps", "eval_samples", "checkpoint_interval_steps"):
            value = getattr(self, name)
            require(value >= 0, f"{name} must be >= 0 but got {value=}")
        epochs, max_steps = self.epochs, self.max_steps
        if max_steps is None:
            require(epochs > 0, f"epochs must be > 0 but got {epochs=}")
        else:
            require(max_steps >= 1, f"max_steps must be >= 1 but got {max_steps=}")
        precision, kind = self.precision, self.device_kind
        require(
            precision in PRECISION_BYTES, f"precision must be fp32/bf16/fp16 but got {precision=}"
        )
        require(kind in DEVICE_KINDS, f"device_kind must be one of {DEVICE_KINDS} but got {kind=}")

    @property
    def trainable_parameters(self) -> int:
        """LoRA parameters trained at this rank."""
        return self.lora_r * self.model.lora_parameters_per_rank


@dataclass(frozen=True)
class Coefficients:
    """Rates that turn a plan's features into seconds and bytes.

    Per-FLOP and per-parameter rates keep the coefficients independent of the model, so a
    prior needs only the hardware. `step_*`, `systematic_*` and `drift_*` give the duration's
    interval, `memory_log_p90` the memory's upper bound.
    """

    micro_fixed_seconds: float
    micro_seconds_per_flop: float
    micro_seconds_per_attention_flop: float
    optimizer_fixed_seconds: float
    optimizer_seconds_per_parameter: float
    eval_fixed_seconds: float
    eval_seconds_per_flop: float
    checkpoint_fixed_seconds: float
    checkpoint_seconds_per_parameter: float
    startup_fixed_seconds: float
    startup_seconds_per_parameter: float
    data_seconds_per_token: float
    memory_fixed_bytes: float
    activation_memory_scale: float = 1.0
    eval_seconds_per_batch: float = 0.005  # one forward call's overhead during evaluation
    loop_seconds_per_micro_step: float = 0.0  # fetch + collate + loop bookkeeping per micro-step
    warmup_seconds: float = 0.0  # extra time of a run's first steps (allocator, lazy init)
    # Adapter matmuls are thin (rank r) and run at their own efficiency; None: as the rest.
    micro_seconds_per_adapter_flop: float | None = None
    step_mean_ratio: float = 1.0  # mean / typical micro-step time (stalls, outliers)
    step_noise_sd: float = 0.0  # relative sd of one micro-step around the mean
    systematic_log_p10: float = _PRIOR_LOG_P10  # quantiles of log(actual / predicted) total
    systematic_log_p90: float = _PRIOR_LOG_P90
    # The machine's own run-to-run drift (a shared VM's speed wanders by 15-60 % in an hour),
    # measured from one configuration run more than once, where the model's error cancels:
    # its log sd, and the log offset of its p90 that widens both ends of the band. 0: unmeasured
    # (the systematic band alone then stands for it, as in calibrations written before).
    drift_log_sd: float = 0.0
    drift_log_p90: float = 0.0
    memory_log_p90: float = _PRIOR_MEMORY_LOG_P90  # log(p90 / p50) of the peak memory
    source: str = "prior"

    @property
    def adapter_seconds_per_flop(self) -> float:
        """Seconds per FLOP of the LoRA adapters' own matmuls."""
        if self.micro_seconds_per_adapter_flop is None:
            return self.micro_seconds_per_flop
        return self.micro_seconds_per_adapter_flop

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Coefficients:
        """Build from `to_dict` output; missing optional fields take their defaults."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise BadInputError(f"unknown coefficient fields {unknown}")
        values: dict[str, object] = {}
        for name, value in data.items():
            if name == "source":
                values[name] = str(value)
            elif value is None and name == "micro_seconds_per_adapter_flop":
                values[name] = None
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                values[name] = float(value)
            else:
                raise BadInputError(f"coefficient {name} must be a number but got {value=}")
        return cls(**values)  # type: ignore[arg-type]


def cpu_matmul_flops(seconds: float = 0.3, *, size: int = 512) -> float:
    """Measure this CPU's fp32 matmul FLOP/s with numpy for about `seconds`."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    a @ b  # warm-up: thread pool start and page faults
    count, start = 0, time.perf_counter()
    while True:
        a @ b
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * size**3 * count / elapsed


def peak_flops(
    hardware: HardwareInfo, *, cpu_probe: Callable[[], float] = cpu_matmul_flops
) -> float:
    """Dense peak FLOP/s of the device at the hardware's precision (CPU: measured probe)."""
    if hardware.device_kind == "cpu":
        return float(cpu_probe())
    half = hardware.precision != "fp32"
    if hardware.device_kind == "mps":
        return _MPS_PEAK[0] if half else _MPS_PEAK[1]
    known = gpu_peak_flops(hardware.device_name, half=half)
    if known is not None:
        return known
    return _UNKNOWN_GPU_PEAK[0] if half else _UNKNOWN_GPU_PEAK[1]


def gpu_peak_flops(device_name: str, *, half: bool = True) -> float | None:
    """A GPU's dense peak FLOP/s from its name (as CUDA reports it); None when not in the table.

    Args:
        device_name: E.g. "NVIDIA H100 80GB HBM3".
        half: bf16/fp16 tensor-core peak; False: fp32 without TF32.
    """
    name = device_name.upper()
    for key, half_peak, fp32_peak in _GPU_PEAKS:
        if re.search(rf"(?<![A-Z0-9]){key}(?![A-Z0-9])", name):
            return half_peak if half else fp32_peak
    return None


def prior_coefficients(
    hardware: HardwareInfo,
    *,
    cpu_probe: Callable[[], float] = cpu_matmul_flops,
    peak: float | None = None,
) -> Coefficients:
    """Uncalibrated coefficients from peak FLOP/s and a utilisation prior.

    Args:
        hardware: The machine.
        cpu_probe: Returns CPU FLOP/s; tests pass a constant to stay independent of timing.
        peak: The device's dense peak FLOP/s at the hardware's precision, for a GPU the
            table does not know; None: from the table (or the CPU probe).
    """
    on_cpu = hardware.device_kind == "cpu"
    if peak is None:
        peak = peak_flops(hardware, cpu_probe=cpu_probe)
    effective = peak * (_CPU_UTILISATION if on_cpu else _GPU_UTILISATION)
    # Attention matmuls run at lower efficiency (softmax, memory traffic): count them double.
    return Coefficients(
        micro_fixed_seconds=0.005 if on_cpu else 0.03,
        micro_seconds_per_flop=1.0 / effective,
        micro_seconds_per_adapter_flop=1.0 / effective,
        micro_seconds_per_attention_flop=2.0 / effective,
        optimizer_fixed_seconds=0.002 if on_cpu else 0.005,
        optimizer_seconds_per_parameter=3e-9 if on_cpu else 5e-11,
        eval_fixed_seconds=0.5,
        eval_seconds_per_flop=1.0 / effective,
        # A checkpoint holds adapter + AdamW state (~12 bytes/parameter) at ~200 MB/s.
        checkpoint_fixed_seconds=1.0,
        checkpoint_seconds_per_parameter=12 / 200e6,
        # Start-up: imports plus reading the base weights (~4 bytes/parameter at ~300 MB/s).
        startup_fixed_seconds=10.0,
        startup_seconds_per_parameter=4 / 300e6,
        data_seconds_per_token=1e-6,  # one tokenisation pass of a fast tokenizer
        memory_fixed_bytes=512 * 2**20 if on_cpu else 256 * 2**20,
        eval_seconds_per_batch=0.005 if on_cpu else 0.01,
        loop_seconds_per_micro_step=0.001 if on_cpu else 0.002,
        warmup_seconds=0.5 if on_cpu else 2.0,  # GPUs: CUDA context and kernel selection
        source=f"prior:{hardware.device_kind}:{hardware.device_name}",
    )


# ----------------------------------------------------------------------------- features


def _max_moments(lengths: np.ndarray, batch: int) -> tuple[float, float]:
    """E[max] and E[max^2] of the lengths of `batch` distinct samples drawn uniformly.

    A shuffled epoch cut into micro-batches makes each micro-batch a uniform random subset,
    so P(max <= v) = C(#{l <= v}, b) / C(n, b), computed as a product to stay finite.
    """
    n = lengths.size
    batch = min(batch, n)
    values, counts = np.unique(lengths, return_counts=True)
    below = np.cumsum(counts).astype(np.float64)
    j = np.arange(batch, dtype=np.float64)
    terms = np.clip((below[:, None] - j) / (n - j), 0.0, None)
    cdf = np.prod(terms, axis=1)
    pmf = np.diff(cdf, prepend=0.0)
    v = values.astype(np.float64)
    return float(pmf @ v), float(pmf @ v**2)


def _clipped(lengths: Sequence[int], max_length: int) -> np.ndarray:
    return np.minimum(np.asarray(lengths, dtype=np.int64), max_length)


def expected_padded_tokens(lengths: Sequence[int], micro_batch_size: int, max_length: int) -> float:
    """Expected padded tokens of one micro-batch under dynamic padding.

    Each micro-batch is padded to its longest sample, so the answer is
    micro_batch_size x E[max length of micro_batch_size samples], exact for the empirical
    distribution (no simulation).
    """
    clipped = _clipped(lengths, max_length)
    batch = min(micro_batch_size, clipped.size)
    return batch * _max_moments(clipped, batch)[0]


def _epoch_averages(lengths: np.ndarray, samples: int, batch: int) -> tuple[float, float]:
    """Mean padded tokens and mean b*s^2 per micro-batch over a pass of `samples` samples."""
    full, rest = divmod(samples, batch)
    tokens = square = 0.0
    for size, count in ((batch, full), (rest, 1 if rest else 0)):
        if count:
            m1, m2 = _max_moments(lengths, size)
            tokens += count * size * m1
            square += count * size * m2
    n_batches = full + (1 if rest else 0)
    return tokens / max(n_batches, 1), square / max(n_batches, 1)


def _packed_averages(
    lengths: np.ndarray, max_length: int, batch: int, fused: bool
) -> tuple[int, float, float]:
    """Packed sequences, mean tokens and mean attention term per micro-batch of `batch` of them.

    A packed micro-batch is one row of real tokens only. Fused (flash) attention works on each
    sample's block (sum of squared sample lengths); eager and SDPA attention with the
    block-diagonal mask compute the whole row's scores and mask them (row length squared).
    """
    sequences = pack_lengths(lengths.tolist(), max_length)
    tokens = float(lengths.sum()) / len(sequences) * batch
    if fused:
        per_sequence = float((lengths.astype(np.float64) ** 2).sum()) / len(sequences)
        return len(sequences), tokens, per_sequence * batch
    return len(sequences), tokens, tokens**2


def frozen_flops(total_parameters: float, tokens: float, gradient_checkpointing: bool) -> float:
    """Matmul FLOPs of the frozen weights in one micro-step over `tokens` padded tokens.

    Frozen weights need no weight gradients: forward 2N + input-gradient 2N = 4N per token
    (2/3 of the 6N rule); checkpointing re-runs the forward (+2N).
    """
    return (6.0 if gradient_checkpointing else 4.0) * total_parameters * tokens


def adapter_flops(
    trainable_parameters: float, tokens: float, gradient_checkpointing: bool
) -> float:
    """Matmul FLOPs of the LoRA adapters (trained fully: 6P per token, +2P recomputed)."""
    return (8.0 if gradient_checkpointing else 6.0) * trainable_parameters * tokens


def attention_flops(
    model: ModelProfile, batch_seq_squared: float, gradient_checkpointing: bool
) -> float:
    """Attention score FLOPs (QK^T and AV, 4*h*s^2 per layer forward, x3 with backward)."""
    factor = 16.0 if gradient_checkpointing else 12.0
    return factor * model.n_layers * model.hidden_size * batch_seq_squared


def activation_bytes(
    model: ModelProfile,
    micro_batch_size: int,
    seq_len: int,
    precision: str,
    gradient_checkpointing: bool,
    device_kind: str = "cpu",
) -> float:
    """Activation + logits memory of one micro-batch.

    About 34 bytes per token x hidden per layer at 16 bit (Korthikanti et al. 2022,
    "Reducing Activation Recomputation in Large Transformer Models"), plus attention scores
    of about h/64 heads; fused (flash) attention, used on CUDA at half precision, stores no
    scores.
    """
    width = PRECISION_BYTES[precision]
    tokens = micro_batch_size * seq_len
    fused = device_kind == "cuda" and precision != "fp32"
    heads = max(model.hidden_size / 64.0, 1.0)
    scores = 0.0 if fused else 2.5 * heads * micro_batch_size * seq_len**2
    per_layer = 17.0 * tokens * model.hidden_size + scores
    if gradient_checkpointing:
        # Only each layer's input is kept; one layer's activations exist during recompute.
        layers = model.n_layers * tokens * model.hidden_size + per_layer
    else:
        layers = model.n_layers * per_layer
    logits = 2.0 * 4.0 * tokens * model.vocab_size  # fp32 logits and their gradient
    return layers * width + logits


# Bytes per trainable (LoRA) parameter: fp32 adapter, its fp32 gradient, AdamW's two moments.
_TRAINABLE_BYTES = {"lora_parameters": 4.0, "lora_gradients": 4.0, "optimizer_state": 8.0}


# NF4 with double quantization (Dettmers et al. 2023): 4 bits per weight, one 8-bit constant per
# block of 64 weights, one fp32 constant per 256 blocks: 4.127 bits.
NF4_BYTES_PER_WEIGHT = (4.0 + 8.0 / 64.0 + 32.0 / (64.0 * 256.0)) / 8.0
# Micro-steps of a 4-bit base are slower: each weight is de-quantized for the forward pass and
# again for the input gradient. Prior: QLoRA's runs took 1.39x the LoRA run's time (Raschka,
# "Practical Tips for Finetuning LLMs Using LoRA", 2023, 7B on an A100), with a band until
# trials measure it (x1.15 to x1.8 at p10/p90).
NF4_STEP_FACTOR = 1.39
NF4_LOG_P90 = math.log(1.8 / NF4_STEP_FACTOR)
NF4_LOG_P10 = math.log(1.15 / NF4_STEP_FACTOR)


def weight_bytes(model: ModelProfile, precision: str, quantization: str = "none") -> float:
    """Bytes of the base weights: at the training precision, or NF4 for the linear layers.

    bitsandbytes quantizes the linear layers only; the input embedding and the output head
    (vocab x hidden each, counted untied: an upper bound) stay at the training precision.
    """
    width = PRECISION_BYTES[precision]
    if quantization != "nf4":
        return float(model.total_parameters * width)
    unquantized = min(2.0 * model.vocab_size * model.hidden_size, model.total_parameters)
    return unquantized * width + (model.total_parameters - unquantized) * NF4_BYTES_PER_WEIGHT


def static_memory_bytes(model: ModelProfile, trainable_parameters: float, precision: str) -> float:
    """Weights at training precision + fp32 adapters, their gradients and AdamW's two moments."""
    per_parameter = sum(_TRAINABLE_BYTES.values())
    return (
        model.total_parameters * PRECISION_BYTES[precision] + per_parameter * trainable_parameters
    )


# ----------------------------------------------------------------------------- predict


@dataclass(frozen=True)
class Estimate:
    """Predicted full-run duration (with an interval), throughput and peak memory.

    `peak_memory_bytes` is the median peak; `peak_memory_bytes_p90` an upper bound that nine
    runs in ten stay under (compare it, not the median, with a memory limit).
    """

    seconds_p10: float
    seconds_p50: float
    seconds_p90: float
    breakdown: dict[str, float]
    tokens_per_second: float  # padded training tokens per second of training time
    peak_memory_bytes: int
    peak_memory_bytes_p90: int
    optimizer_steps: int
    micro_steps: int
    n_evaluations: int
    n_checkpoints: int
    train_tokens: float  # padded tokens over the run
    source: str = "prior"
    extra: dict[str, float] = field(default_factory=dict)

    def cost(self, price_per_hour: float) -> dict[str, float]:
        """Money for the run at `price_per_hour`, for p10/p50/p90."""
        if price_per_hour < 0:
            raise BadInputError(f"price_per_hour must be >= 0 but got {price_per_hour=}")
        return {
            "p10": self.seconds_p10 / 3600.0 * price_per_hour,
            "p50": self.seconds_p50 / 3600.0 * price_per_hour,
            "p90": self.seconds_p90 / 3600.0 * price_per_hour,
        }

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON/YAML-ready dict."""
        return asdict(self)


def _occurrences(steps: int, interval: int) -> int:
    return math.ceil(steps / interval) if interval > 0 else 0


def predict(plan: Plan, coefficients: Coefficients) -> Estimate:
    """Predict the full run described by `plan`: duration with its interval, peak memory."""
    c, model = coefficients, plan.model
    lengths = _clipped(plan.token_lengths, plan.max_length)
    if plan.packing == "padding_free":
        fused = plan.device_kind == "cuda" and plan.precision != "fp32"
        items, tokens, square = _packed_averages(
            lengths, plan.max_length, plan.micro_batch_size, fused
        )
    else:
        items = lengths.size
        tokens, square = _epoch_averages(lengths, lengths.size, plan.micro_batch_size)
    steps = optimizer_steps(plan, items)
    micro_steps = steps * plan.gradient_accumulation_steps
    if plan.quantization == "nf4":
        c = replace(
            c,
            step_mean_ratio=c.step_mean_ratio * NF4_STEP_FACTOR,
            systematic_log_p90=math.hypot(c.systematic_log_p90, NF4_LOG_P90),
            systematic_log_p10=-math.hypot(c.systematic_log_p10, NF4_LOG_P10),
        )
    micro = _micro_step_seconds(plan, c, tokens, square)
    optimizer = c.optimizer_fixed_seconds + c.optimizer_seconds_per_parameter * (
        plan.trainable_parameters
    )
    train = micro_steps * (micro + c.loop_seconds_per_micro_step) + steps * optimizer
    # The Trainer evaluates and saves at every multiple of the interval and once more at the
    # last step when that is not a multiple: ceil(steps / interval) of each.
    n_evals = _occurrences(steps, plan.eval_interval_steps)
    one_eval = _eval_seconds(plan, c, lengths)
    n_ckpt = _occurrences(steps, plan.checkpoint_interval_steps)
    one_ckpt = c.checkpoint_fixed_seconds + c.checkpoint_seconds_per_parameter * (
        plan.trainable_parameters
    )
    breakdown = {
        "startup": c.startup_fixed_seconds
        + c.startup_seconds_per_parameter * model.total_parameters,
        "data_loading": c.data_seconds_per_token * float(lengths.sum()),
        "warmup": c.warmup_seconds,
        "train": train,
        "eval": n_evals * one_eval,
        "checkpoint": n_ckpt * one_ckpt,
    }
    total = sum(breakdown.values())
    low, high = _interval(c, micro_steps, train / total)
    band = interval_components(c, micro_steps, train / total)
    train_tokens = micro_steps * tokens
    memory = _peak_memory_bytes(plan, c, int(lengths.max()))
    return Estimate(
        seconds_p10=total * low,
        seconds_p50=total,
        seconds_p90=total * high,
        breakdown=breakdown,
        tokens_per_second=train_tokens / train if train > 0 else 0.0,
        peak_memory_bytes=memory,
        peak_memory_bytes_p90=int(memory * math.exp(max(c.memory_log_p90, 0.0))),
        optimizer_steps=steps,
        micro_steps=micro_steps,
        n_evaluations=n_evals,
        n_checkpoints=n_ckpt,
        train_tokens=train_tokens,
        source=c.source,
        extra={
            "micro_step_seconds": micro,
            "optimizer_step_seconds": optimizer,
            "eval_seconds_each": one_eval,
            "checkpoint_seconds_each": one_ckpt,
            # The band's parts (log p90 offsets): which one makes it wide.
            **{f"band_{part}_log_p90": band[part] for part in BAND_PARTS},
        },
    )


def _micro_step_seconds(plan: Plan, c: Coefficients, tokens: float, square: float) -> float:
    """Mean micro-step: frozen weights, adapters and attention over the mean padded batch."""
    checkpointing = plan.gradient_checkpointing
    return (
        c.micro_fixed_seconds
        + c.micro_seconds_per_flop
        * frozen_flops(plan.model.compute_parameters, tokens, checkpointing)
        + c.adapter_seconds_per_flop
        * adapter_flops(plan.trainable_parameters, tokens, checkpointing)
        + c.micro_seconds_per_attention_flop * attention_flops(plan.model, square, checkpointing)
    ) * c.step_mean_ratio


def _eval_seconds(plan: Plan, c: Coefficients, lengths: np.ndarray) -> float:
    """One evaluation of `plan.eval_samples` samples, `trainers.spec.eval_batch_size` each."""
    # The trainer records unpadded eval tokens, so the fitted rate already includes padding.
    eval_tokens = plan.eval_samples * float(lengths.mean())
    eval_batches = math.ceil(plan.eval_samples / eval_batch_size(plan.micro_batch_size))
    return (
        c.eval_fixed_seconds
        + c.eval_seconds_per_batch * eval_batches
        + c.eval_seconds_per_flop * 2.0 * plan.model.compute_parameters * eval_tokens
    )


def interval_components(c: Coefficients, micro_steps: int, train_share: float) -> dict[str, float]:
    """The duration band's parts, each as a log offset of p90 above the median.

    Three kinds of error. Per-step noise (`step_noise`) is independent between steps, so its
    relative sd over the sum of M micro-steps shrinks as 1/sqrt(M) (stalls shift the mean,
    which `step_mean_ratio` already carries). The model's own error (`model`: a wrong
    coefficient, a configuration the fit is off for) hits every step alike and does not
    average out; nor does the machine's measured drift (`drift`: counted whole, a drift
    slower than the run does not average out either). The three are independent, so their
    quantile offsets add in quadrature (`total`). `model_p10` is the model's lower offset
    (a negative number; the fit may be skewed).

    Args:
        c: The coefficients.
        micro_steps: Micro-steps of the run.
        train_share: The training steps' share of the run's predicted seconds.
    """
    noise = Z90 * c.step_noise_sd / math.sqrt(max(micro_steps, 1)) * train_share
    return {
        "model": c.systematic_log_p90,
        "model_p10": c.systematic_log_p10,
        "drift": c.drift_log_p90,
        "step_noise": noise,
        "total": math.hypot(c.systematic_log_p90, c.drift_log_p90, noise),
    }


def _interval(c: Coefficients, micro_steps: int, train_share: float) -> tuple[float, float]:
    """Factors that turn the median duration into p10 and p90 (see `interval_components`)."""
    parts = interval_components(c, micro_steps, train_share)
    low = math.exp(-math.hypot(parts["model_p10"], parts["drift"], parts["step_noise"]))
    return low, math.exp(parts["total"])


def memory_breakdown(
    plan: Plan, coefficients: Coefficients, longest: int | None = None
) -> dict[str, float]:
    """Peak memory in bytes by part; `predict`'s `peak_memory_bytes` is their sum.

    Args:
        plan: The run.
        coefficients: The machine's (calibrated) coefficients.
        longest: Tokens of the longest sample; default: from the plan's lengths.
    """
    trainable = float(plan.trainable_parameters)
    rows = plan.micro_batch_size
    if plan.packing == "padding_free":  # one row of up to micro_batch_size x max_length
        rows, longest = 1, plan.micro_batch_size * plan.max_length
    elif longest is None:
        longest = max(min(n, plan.max_length) for n in plan.token_lengths)
    return {
        "weights": weight_bytes(plan.model, plan.precision, plan.quantization),
        **{part: per * trainable for part, per in _TRAINABLE_BYTES.items()},
        "activations": coefficients.activation_memory_scale
        * activation_bytes(
            plan.model,
            rows,
            longest,
            plan.precision,
            plan.gradient_checkpointing,
            plan.device_kind,
        ),
        "runtime_overhead": coefficients.memory_fixed_bytes,  # CUDA context, allocator
    }


def _peak_memory_bytes(plan: Plan, c: Coefficients, longest: int) -> int:
    """Fixed overhead + weights and optimizer state + the activations of the longest batch."""
    return int(sum(memory_breakdown(plan, c, longest).values()))
