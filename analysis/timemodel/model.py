"""Predict the duration, cost and peak memory of a full LoRA fine-tuning run.

Full-run seconds = start-up + data loading + warm-up + optimizer steps x (accumulation x
(micro-step time + loop overhead) + optimizer-step time) + evaluations + checkpoint saves.
Every term is a small linear model over physical features (`analysis.timemodel.workload`: FLOPs of
the frozen weights and of the adapters, attention, parameters, tokens) whose coefficients
are either priors from the device's peak FLOP/s (`analysis.timemodel.hardware.prior_coefficients`) or
fitted to measured steps (`analysis.calibration`).

Pure numpy (and the step count of `trainers.spec`): importable without torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from analysis.timemodel.interconnect import (
    DEFAULT_LINK,
    GRADIENT_BYTES,
    allreduce_seconds,
    expected_max_normal,
    find_link,
    straggler_seconds,
)
from analysis.timemodel.workload import (
    LEVER_STEP_FACTOR,
    NF4_LOG_P10,
    NF4_LOG_P90,
    NF4_STEP_FACTOR,
    PRECISION_BYTES,
    TRAINABLE_BYTES,
    activation_bytes,
    adapter_flops,
    attention_flops,
    clipped_lengths,
    epoch_averages,
    expected_new_shapes,
    frozen_flops,
    grouped_padded_lengths,
    packed_averages,
    padded_length_pmf,
    padded_moments,
    weight_bytes,
)
from common.checks import require
from common.config import require_keys
from common.errors import BadInputError
from trainers.model.runtime import per_sample_attention
from trainers.spec import PACKING_MODES, QUANTIZATION_MODES, eval_batch_size, optimizer_steps

DEVICE_KINDS = ("cpu", "cuda", "mps")
Z90 = 1.2815515655446004  # standard normal quantile of 0.9
BAND_PARTS = ("model", "drift", "step_noise", "total")  # see `interval_components`

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
            sequences, each micro-batch is one row without padding; or "group_by_length":
            samples kept apart, each micro-batch drawn from samples of about its length
            (`workload.grouped_padded_lengths`).
        quantization: "none", or "nf4": the base's linear layers in 4 bits (QLoRA,
            `trainers.model.quantization`): `weight_bytes` and `NF4_STEP_FACTOR`.
        gpus: Processes (GPUs) training the run data-parallel: each runs
            `micro_batch_size` x `gradient_accumulation_steps` samples per optimizer step,
            then the adapter's gradients are all-reduced (`analysis.timemodel.interconnect`).
        interconnect: The link between the GPUs (a name in `analysis.timemodel.interconnect.LINKS`).
        levers: The speed levers the run uses (`trainers.model.levers`): their step factors
            (`LEVER_STEP_FACTOR`), and no stored logits under Liger's fused loss.
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
    gpus: int = 1
    interconnect: str = DEFAULT_LINK
    levers: tuple[str, ...] = ()

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
        for name in (
            "micro_batch_size",
            "gradient_accumulation_steps",
            "max_length",
            "lora_r",
            "gpus",
        ):
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
        find_link(self.interconnect)

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
    # Extra time of a steady micro-step at a padded length the run has not seen yet (GPU:
    # new allocator blocks, kernel choices); a run pays it once per length.
    new_shape_seconds: float = 0.0
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
    # What the CUDA caching allocator reserves over what tensors hold at the peak: the peak
    # above is of allocated memory, the device runs out at the reserved one (1: CPU, MPS).
    reserved_over_allocated: float = 1.0
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
        require_keys(cls, data, "coefficient")
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


# ----------------------------------------------------------------------------- predict


@dataclass(frozen=True)
class Estimate:
    """Predicted full-run duration (with an interval), throughput and peak memory.

    `peak_memory_bytes` is the median peak; `peak_memory_bytes_p90` an upper bound that nine
    runs in ten stay under; on CUDA both count what tensors hold, and
    `peak_reserved_bytes_p90` what the caching allocator then holds. Compare
    `memory_bound_bytes`, not the median, with a memory limit.
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
    train_tokens: float  # padded tokens over the run, on all its GPUs
    source: str = "prior"
    extra: dict[str, float] = field(default_factory=dict)
    gpus: int = 1  # the run's GPUs: each is paid for the whole run
    peak_reserved_bytes_p90: int = 0  # 0: no allocator beyond the peak (CPU, MPS, a plan's own)

    @property
    def memory_bound_bytes(self) -> int:
        """What the device must hold, nine runs in ten: the reserved p90 where there is one."""
        return max(self.peak_memory_bytes_p90, self.peak_reserved_bytes_p90)

    def cost(self, price_per_hour: float) -> dict[str, float]:
        """Money for the run at `price_per_hour` per GPU, for p10/p50/p90."""
        if price_per_hour < 0:
            raise BadInputError(f"price_per_hour must be >= 0 but got {price_per_hour=}")
        rate = price_per_hour * self.gpus
        return {
            "p10": self.seconds_p10 / 3600.0 * rate,
            "p50": self.seconds_p50 / 3600.0 * rate,
            "p90": self.seconds_p90 / 3600.0 * rate,
        }

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON/YAML-ready dict."""
        return asdict(self)


def _occurrences(steps: int, interval: int) -> int:
    return math.ceil(steps / interval) if interval > 0 else 0


def predict(plan: Plan, coefficients: Coefficients) -> Estimate:
    """Predict the full run described by `plan`: duration with its interval, peak memory."""
    c, model = coefficients, plan.model
    lengths = clipped_lengths(plan.token_lengths, plan.max_length)
    grouped: tuple[np.ndarray, np.ndarray] | None = None  # computed once, used twice
    if plan.packing == "padding_free":
        items, tokens, square, shapes = packed_averages(
            lengths, plan.max_length, plan.micro_batch_size, per_sample_attention()
        )
        shape_batch = 1
    elif plan.packing == "group_by_length":
        items = lengths.size
        grouped = _grouped(plan, lengths)
        tokens, square = padded_moments(*grouped)
        shapes, shape_batch = grouped[0], 1  # each micro-batch's length, as often as it comes
    else:
        items = lengths.size
        tokens, square = epoch_averages(lengths, lengths.size, plan.micro_batch_size)
        shapes, shape_batch = lengths, plan.micro_batch_size
    steps = optimizer_steps(plan, items)
    micro_steps = steps * plan.gradient_accumulation_steps
    # Each padded length's first micro-step pays the one-off cost; the first one is warm-up.
    new_shapes = max(expected_new_shapes(shapes, shape_batch, micro_steps) - 1.0, 0.0)
    if plan.quantization == "nf4":
        c = replace(
            c,
            step_mean_ratio=c.step_mean_ratio * NF4_STEP_FACTOR,
            systematic_log_p90=math.hypot(c.systematic_log_p90, NF4_LOG_P90),
            systematic_log_p10=-math.hypot(c.systematic_log_p10, NF4_LOG_P10),
        )
    for lever in plan.levers:
        c = replace(c, step_mean_ratio=c.step_mean_ratio * LEVER_STEP_FACTOR[lever])
    micro = _micro_step_seconds(plan, c, tokens, square)
    optimizer = c.optimizer_fixed_seconds + c.optimizer_seconds_per_parameter * (
        plan.trainable_parameters
    )
    # On N GPUs `steps` and `micro_steps` are each GPU's share; every step then all-reduces
    # the adapter's gradients and waits for the slowest GPU.
    allreduce = allreduce_seconds(plan.trainable_parameters, plan.gpus, find_link(plan.interconnect))
    # A GPU's micro-step varies by its noise and, padded to its longest sample, by its
    # batch's length: the step waits for the longest of the N.
    varies = (
        math.hypot(c.step_noise_sd, padding_sd(plan, c, lengths, grouped))
        if plan.gpus > 1
        else 0.0
    )
    straggler = straggler_seconds(micro, varies, plan.gradient_accumulation_steps, plan.gpus)
    train = micro_steps * (micro + c.loop_seconds_per_micro_step) + steps * optimizer
    train += steps * (allreduce + straggler)
    train += c.new_shape_seconds * new_shapes
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
    train_tokens = micro_steps * tokens * plan.gpus
    memory = _peak_memory_bytes(plan, c, int(lengths.max()))
    memory_p90 = memory * math.exp(max(c.memory_log_p90, 0.0))
    return Estimate(
        seconds_p10=total * low,
        seconds_p50=total,
        seconds_p90=total * high,
        breakdown=breakdown,
        tokens_per_second=train_tokens / train if train > 0 else 0.0,
        peak_memory_bytes=memory,
        peak_memory_bytes_p90=int(memory_p90),
        peak_reserved_bytes_p90=int(memory_p90 * max(c.reserved_over_allocated, 1.0)),
        optimizer_steps=steps,
        micro_steps=micro_steps,
        n_evaluations=n_evals,
        n_checkpoints=n_ckpt,
        train_tokens=train_tokens,
        source=c.source,
        gpus=plan.gpus,
        extra={
            "micro_step_seconds": micro,
            "optimizer_step_seconds": optimizer,
            "eval_seconds_each": one_eval,
            "checkpoint_seconds_each": one_ckpt,
            "allreduce_seconds_each": allreduce,
            "straggler_seconds_each": straggler,
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


def padding_sd(
    plan: Plan,
    c: Coefficients,
    lengths: np.ndarray,
    grouped: tuple[np.ndarray, np.ndarray] | None = None,
) -> float:
    """Relative sd of a micro-step's time over the padded lengths its batches take.

    A micro-batch is padded to its longest sample, so its work varies with that maximum
    (exact over the data's lengths, `padded_length_pmf`); the part of a micro-step that does
    not grow with tokens damps it. Packed rows (about `max_length` each) and data of one
    length do not vary. On N GPUs this variation, not the machine's noise, is most of what a
    step waits for: H2O LLM Studio's DDP table (micro-batch 2, dynamic padding) loses 6-13 %
    at 2 GPUs and 11-33 % at 4-8, growing with N as the expected maximum of N does
    (docs/benchmarks/multi_gpu_scaling.md).
    """
    if plan.packing == "padding_free" or lengths.size == 0:
        return 0.0
    # A micro-step's time is linear in its tokens and in its b x s^2: three points fix it.
    fixed = _micro_step_seconds(plan, c, 0.0, 0.0)
    per_token = _micro_step_seconds(plan, c, 1.0, 0.0) - fixed
    per_square = _micro_step_seconds(plan, c, 0.0, 1.0) - fixed
    if plan.packing == "group_by_length":
        padded, sizes = grouped if grouped is not None else _grouped(plan, lengths)
        return _grouped_wait_sd(plan, padded, sizes, fixed, per_token, per_square)
    batch = min(plan.micro_batch_size, int(lengths.size))
    values, pmf = padded_length_pmf(lengths, batch)
    times = fixed + per_token * batch * values + per_square * batch * values**2
    mean = float(pmf @ times)
    if mean <= 0:
        return 0.0
    return math.sqrt(max(float(pmf @ (times - mean) ** 2), 0.0)) / mean


def _grouped(plan: Plan, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each micro-batch's padded length and size over an epoch grouped by length: the
    sampler groups one optimizer step of every GPU."""
    return grouped_padded_lengths(
        lengths, plan.micro_batch_size, plan.gradient_accumulation_steps * plan.gpus
    )


def _grouped_wait_sd(
    plan: Plan,
    padded: np.ndarray,
    sizes: np.ndarray,
    fixed: float,
    per_token: float,
    per_square: float,
) -> float:
    """The relative sd that makes `straggler_seconds` wait as long as a grouped epoch does.

    Grouped by length, the N GPUs take consecutive micro-batches of one sorted mega-batch
    (accelerate hands batch k to process k mod N), so at a step their lengths are close and
    the wait for the longest is small but not random: it is summed here over the epoch's
    optimizer steps, then expressed as the sd a random wait of that size would have.
    """
    times = fixed + per_token * sizes * padded + per_square * sizes * padded**2
    per_step = plan.gradient_accumulation_steps * plan.gpus
    steps = times.size // per_step
    mean = float(times.mean())
    if steps == 0 or mean <= 0:
        return 0.0
    # Micro-batch k: micro-step k // N, process k % N; a step sums its accumulation's times.
    work = times[: steps * per_step].reshape(steps, plan.gradient_accumulation_steps, plan.gpus)
    per_gpu = work.sum(axis=1)
    wait = float((per_gpu.max(axis=1) - per_gpu.mean(axis=1)).mean())
    unit = expected_max_normal(plan.gpus) * mean * math.sqrt(plan.gradient_accumulation_steps)
    return wait / unit if unit > 0 else 0.0


def _eval_seconds(plan: Plan, c: Coefficients, lengths: np.ndarray) -> float:
    """One evaluation of `plan.eval_samples` samples, `trainers.spec.eval_batch_size` each.

    On N GPUs each scores every N-th sample (`MeasuredTrainer.evaluation_loop`), at once.
    """
    samples = math.ceil(plan.eval_samples / max(plan.gpus, 1))
    # The trainer records unpadded eval tokens, so the fitted rate already includes padding.
    eval_tokens = samples * float(lengths.mean())
    eval_batches = math.ceil(samples / eval_batch_size(plan.micro_batch_size))
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
        **{part: per * trainable for part, per in TRAINABLE_BYTES.items()},
        "activations": coefficients.activation_memory_scale
        * activation_bytes(
            plan.model,
            rows,
            longest,
            plan.precision,
            plan.gradient_checkpointing,
            plan.device_kind,
            fused_loss="liger" in plan.levers,
        ),
        "runtime_overhead": coefficients.memory_fixed_bytes,  # CUDA context, allocator
        # DDP's gradient buckets: a second copy of the adapter's gradients on each GPU.
        "ddp_buckets": float(GRADIENT_BYTES * trainable) if plan.gpus > 1 else 0.0,
    }


def _peak_memory_bytes(plan: Plan, c: Coefficients, longest: int) -> int:
    """Fixed overhead + weights and optimizer state + the activations of the longest batch."""
    return int(sum(memory_breakdown(plan, c, longest).values()))
