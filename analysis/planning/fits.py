"""A run -> the time model's plan of it, and whether that run fits a GPU and a window.

`plan_of_spec` is the one translation of a `TrainSpec` into the time model's `Plan`: the
study's estimator, `python -m analysis.calibrate` and the time-model benchmarks all predict
through it, so a prediction is always of the run that trains. `plan_of_shape` plans the
full run of a `RunShape` (the choices that set a run's duration and memory) with a study's
defaults, for `python -m analysis.plan`; `probe_spec` is a short measured run of one
shape. Runs are built by `trainers.run_spec.run_spec`, the one translation of a choice into
a `TrainSpec`. The model's profile comes from `analysis.timemodel.machine`, the data's token lengths
from `analysis.planning.inputs`, the prediction from `analysis.timemodel.model.predict`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.calibration.file import Calibration, load
from analysis.priors import fitted as fitted_priors
from analysis.timemodel.gpus import GpuSpec, peak_of
from analysis.timemodel.hardware import HardwareInfo, prior_coefficients
from analysis.timemodel.model import Coefficients, Estimate, ModelProfile, Plan, predict
from analysis.timemodel.run_setup import ATTENTION_RATE, MemoryTerms, RunSetup, peak_memory
from trainers.model.levers import requested_levers
from trainers.run_spec import Settings, run_spec
from trainers.spec import (
    STUDY_EVAL_SAMPLES,
    STUDY_FULL_CHECKPOINT_INTERVAL,
    STUDY_FULL_EVAL_INTERVAL,
    TrainSpec,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# The fields a `Plan` takes from its `TrainSpec` as they are.
_SAME_IN_PLAN = (
    "epochs",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "max_length",
    "gradient_checkpointing",
    "packing",
    "quantization",
    "gpus",
)
# What a planned full run evaluates and saves: a study's defaults.
STUDY_SETTINGS = Settings(
    eval_interval=STUDY_FULL_EVAL_INTERVAL,
    checkpoint_interval=STUDY_FULL_CHECKPOINT_INTERVAL,
    eval_samples=STUDY_EVAL_SAMPLES,
)


# ----------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class RunShape:
    """The choices that set a run's duration and memory (the keys of a sampled configuration)."""

    micro_batch_size: int
    gradient_accumulation_steps: int
    max_length: int
    lora_r: int
    gradient_checkpointing: bool = False
    epochs: float = 1.0
    gpus: int = 1  # data-parallel: micro-batch and accumulation are each GPU's


def plan_of_spec(
    spec: TrainSpec,
    model: ModelProfile,
    token_lengths: Sequence[int],
    *,
    n_validation: int,
    hardware: HardwareInfo,
) -> Plan:
    """The time model's view of the run `spec` describes.

    Args:
        spec: The run.
        model: The profile of `spec.model`.
        token_lengths: Token lengths of the training samples at `spec.max_length`.
        n_validation: Validation samples there are; an evaluation reads at most that many.
        hardware: The machine; its precision (with "auto" resolved) and device kind count.
    """
    return Plan(
        model=model,
        token_lengths=tuple(token_lengths),
        lora_r=spec.lora.r,
        eval_interval_steps=spec.eval_interval,
        eval_samples=min(spec.eval_samples, n_validation),
        checkpoint_interval_steps=spec.checkpoint_interval,
        precision=hardware.precision,
        device_kind=hardware.device_kind,
        # A trial stops early in its full run's schedule: it takes only those steps.
        max_steps=spec.stop_after_steps or spec.max_steps,
        levers=requested_levers(spec.liger, spec.sdpa_fast_path, hardware.device_kind),
        **{name: getattr(spec, name) for name in _SAME_IN_PLAN},
    )


def plan_of_shape(
    shape: RunShape, model: ModelProfile, lengths: Sequence[int], gpu: GpuSpec
) -> Plan:
    """The time model's plan of a full run of `shape` (the study's intervals and evaluation)."""
    spec = run_spec(
        dataclasses.asdict(shape),
        dataclasses.replace(STUDY_SETTINGS, epochs=shape.epochs),
        model="config.json",
        data="data.jsonl",
    )
    clipped = [min(n, shape.max_length) for n in lengths]
    return plan_of_spec(
        spec, model, clipped, n_validation=STUDY_EVAL_SAMPLES, hardware=gpu.hardware()
    )


def probe_spec(
    shape: DataclassInstance,
    *,
    model: str,
    data: str,
    work_dir: str | Path,
    name: str,
    max_steps: int,
    eval_interval: int,
    checkpoint_interval: int,
    eval_samples: int,
    device: str = "auto",
    precision: str = "auto",
) -> TrainSpec:
    """A short measured run of one configuration (lora_alpha = 2 x rank, default dropout).

    Args:
        shape: A run shape's values (micro-batch, accumulation, max_length, rank), as a
            dataclass: a `RunShape` or a probe point.
        model: Local model folder.
        data: JSONL data.
        work_dir: Holds the run's output folder `name` and the shared tokenized cache.
        name: The run's output folder.
        max_steps: Optimizer steps.
        eval_interval: Steps between evaluations (0: only at the end).
        checkpoint_interval: Steps between checkpoint saves (0: none).
        eval_samples: Validation samples per evaluation.
        device: auto | cpu | cuda | mps.
        precision: auto | fp32 | bf16 | fp16.
    """
    settings = Settings(
        work_dir=work_dir,
        eval_interval=eval_interval,
        checkpoint_interval=checkpoint_interval,
        eval_samples=eval_samples,
        device=device,
        precision=precision,
    )
    return run_spec(
        dataclasses.asdict(shape),
        settings,
        model=model,
        data=data,
        output_dir=Path(work_dir) / name,
        max_steps=max_steps,
    )


def coefficients_for(
    gpu: GpuSpec, *, calibrations: Sequence[str] = (), tflops: float | None = None
) -> tuple[Coefficients, str]:
    """The calibration measured on this GPU when one of `calibrations` is, else its priors.

    A calibration's rates are per FLOP and per parameter, so one fitted with another model
    on the same GPU and precision still applies.

    Returns:
        The coefficients, and a sentence saying where they come from.
    """
    notes = []
    for path in calibrations:
        calibration = load(path)
        if _same_gpu(calibration, gpu):
            return calibration.coefficients, (
                f"calibration {path} (measured on {calibration.hardware.device_name}, "
                f"{calibration.hardware.precision}, {sum(calibration.n_measurements.values())} "
                f"measurements with a {calibration.model.total_parameters / 1e9:.2g}B model)"
            )
        notes.append(f"{path} is for {calibration.hardware.device_name}")
    peak = peak_of(gpu, tflops)
    fitted = fitted_priors.load()
    if fitted is None:
        prior = prior_coefficients(gpu.hardware(), peak=peak)
        where = f"priors for {gpu.name} ({peak / 1e12:g} TFLOP/s {gpu.precision} peak)"
    else:
        prior = fitted_priors.coefficients(gpu, fitted, peak=peak)
        kind = fitted.utilisation_source(gpu)
        where = (
            f"priors for {gpu.name} ({peak / 1e12:g} TFLOP/s {gpu.precision} peak; {kind} "
            f"utilisation {fitted.utilisation_for(gpu):.2f} fitted to "
            f"{len(fitted.timed_points)} measured runs (analysis/priors/published_runs.json), band "
            f"x{math.exp(fitted.log_p10):.2f}-x{math.exp(fitted.log_p90):.2f})"
        )
    return prior, where + (f"; not calibrated there ({'; '.join(notes)})" if notes else "")


def _same_gpu(calibration: Calibration, gpu: GpuSpec) -> bool:
    hardware = calibration.hardware
    return (
        hardware.device_kind == "cuda"
        and hardware.device_name.strip().lower() == gpu.device_name.strip().lower()
        and hardware.precision == gpu.precision
    )


@dataclass(frozen=True)
class Fit:
    """One run's prediction and whether it fits the window and the GPU's memory."""

    shape: RunShape
    estimate: Estimate
    fits_memory: bool
    fits_window: bool | None  # None: no window given

    @property
    def fits(self) -> bool:
        """Fits the memory and, when one is given, the window."""
        return self.fits_memory and self.fits_window is not False


def with_setup(plan: Plan, setup: RunSetup) -> Plan:
    """The plan with the setup's packing and quantization."""
    return dataclasses.replace(
        plan,
        packing="padding_free"
        if setup.packing
        else ("group_by_length" if setup.group_by_length else "none"),
        quantization=setup.quantization,
        interconnect=setup.interconnect,
    )


def evaluate(
    shape: RunShape,
    model: ModelProfile,
    lengths: Sequence[int],
    gpu: GpuSpec,
    coefficients: Coefficients,
    *,
    window_hours: float | None = None,
    setup: RunSetup | None = None,
    memory: MemoryTerms | None = None,
) -> Fit:
    """Predict one run; it fits when its p90 memory and its p90 duration do.

    With a `setup` (attention kernel, logits precision, longest sample, memory measure) the
    peak memory is `analysis.timemodel.run_setup.peak_memory` with `memory` terms, and the attention
    kernel sets the attention FLOPs' rate; without one, the time model's own memory estimate.
    """
    plan = plan_of_shape(shape, model, lengths, gpu)
    if setup is not None:
        plan = with_setup(plan, setup)
    if setup is not None:
        coefficients = dataclasses.replace(
            coefficients,
            micro_seconds_per_attention_flop=coefficients.micro_seconds_per_attention_flop
            * ATTENTION_RATE[setup.attention],
        )
    estimate = predict(plan, coefficients)
    if setup is not None:
        p50, p90 = peak_memory(plan, setup, memory or MemoryTerms())
        estimate = dataclasses.replace(  # in the setup's own measure, reserved or allocated
            estimate, peak_memory_bytes=int(p50), peak_memory_bytes_p90=int(p90),
            peak_reserved_bytes_p90=0,
        )  # fmt: skip
    fits_memory = estimate.memory_bound_bytes <= gpu.memory_gib * 2**30
    window = None if window_hours is None else estimate.seconds_p90 <= window_hours * 3600
    return Fit(shape, estimate, fits_memory, window)


@dataclass(frozen=True)
class Target:
    """What runs are planned for: the model, the data's lengths, the GPU, the window, the setup.

    Attributes:
        model: The model's profile.
        lengths: Token lengths of the training samples.
        gpu: The GPU.
        coefficients: The time model's coefficients there (`coefficients_for`).
        window_hours: The window a run must end in (p90); None: no window.
        setup: Attention kernel, logits precision, longest sample, memory measure (see
            `evaluate`).
        memory: The memory terms with `setup`.
    """

    model: ModelProfile
    lengths: Sequence[int]
    gpu: GpuSpec
    coefficients: Coefficients
    window_hours: float | None = None
    setup: RunSetup | None = None
    memory: MemoryTerms | None = None

    def evaluate(self, shape: RunShape) -> Fit:
        """Predict a run of `shape` here (`evaluate`)."""
        return evaluate(
            shape, self.model, self.lengths, self.gpu, self.coefficients,
            window_hours=self.window_hours, setup=self.setup, memory=self.memory,
        )  # fmt: skip

    def plan(self, shape: RunShape) -> Plan:
        """The time model's plan of a full run of `shape` here, with the setup's packing."""
        plan = plan_of_shape(shape, self.model, self.lengths, self.gpu)
        return plan if self.setup is None else with_setup(plan, self.setup)


def best_of_profile(
    profile: Any,
    target: Target,
    *,
    lora_r: int,
    epochs: float,
    max_length: int | None = None,
) -> Fit:
    """The profile's fastest fitting micro-batch x accumulation (by p90), else its leanest.

    Args:
        profile: A `search_spaces.Profile`.
        target: What the run is planned for.
        lora_r: The adapter's rank.
        epochs: The run's epochs.
        max_length: Instead of the profile's own.
    """
    fits = [
        target.evaluate(
            RunShape(
                micro_batch_size=mb,
                gradient_accumulation_steps=ga,
                max_length=max_length or profile.length(),
                lora_r=lora_r,
                gradient_checkpointing=profile.gradient_checkpointing,
                epochs=epochs,
            )
        )
        for mb in profile.micro_batch_size
        for ga in profile.gradient_accumulation_steps
    ]
    fitting = [f for f in fits if f.fits]
    if fitting:
        return min(fitting, key=lambda f: f.estimate.seconds_p90)
    return min(fits, key=lambda f: f.estimate.peak_memory_bytes_p90)


def per_gpu_shape(shape: RunShape, gpus: int) -> RunShape:
    """`shape` (planned for one GPU) on `gpus` GPUs, at the same effective batch where it can.

    The accumulation is divided among the GPUs; where it does not divide, the micro-batch is
    (one micro-step per step on each GPU); where neither does, the accumulation is rounded
    and the effective batch changes (the shape's `gpus` and batch sizes say by how much).
    """
    micro, accumulation = shape.micro_batch_size, shape.gradient_accumulation_steps
    batch = micro * accumulation
    if accumulation % gpus == 0:
        micro, accumulation = micro, accumulation // gpus
    elif batch % gpus == 0 and batch // gpus <= micro:
        micro, accumulation = batch // gpus, 1
    else:
        accumulation = max(1, round(accumulation / gpus))
    return dataclasses.replace(
        shape, micro_batch_size=micro, gradient_accumulation_steps=accumulation, gpus=gpus
    )


def gpu_counts(
    shape: RunShape, target: Target, counts: Sequence[int]
) -> tuple[list[Fit], Fit | None, Fit | None]:
    """The run of `shape` on each of `counts` GPUs; the fastest and the cheapest that fit.

    The cheapest pays the fewest GPU-hours at p90 (cost = GPUs x price x hours), the fewer
    GPUs on a tie; the fastest ends first at p90. None: no count fits.
    """
    fits = [target.evaluate(per_gpu_shape(shape, n)) for n in counts]
    fitting = [f for f in fits if f.fits]
    if not fitting:
        return fits, None, None
    fastest = min(fitting, key=lambda f: (f.estimate.seconds_p90, f.shape.gpus))
    cheapest = min(fitting, key=lambda f: (f.shape.gpus * f.estimate.seconds_p90, f.shape.gpus))
    return fits, fastest, cheapest


def toggled_checkpointing(fit: Fit, target: Target) -> Fit:
    """The same run with gradient checkpointing switched the other way."""
    shape = dataclasses.replace(
        fit.shape, gradient_checkpointing=not fit.shape.gradient_checkpointing
    )
    return target.evaluate(shape)


def same_batch_variants(shape: RunShape) -> list[RunShape]:
    """`shape` at each smaller micro-batch that keeps its effective batch, checkpointing off
    and on: the changes that lower a run's peak memory and leave what it trains the same.

    The micro-batches are the divisors of the effective batch below the shape's own (its
    accumulation takes up the rest), so the optimizer sees the same batches in the same order.
    """
    batch = shape.micro_batch_size * shape.gradient_accumulation_steps
    micros = [m for m in range(shape.micro_batch_size, 0, -1) if batch % m == 0]
    return [
        dataclasses.replace(
            shape, micro_batch_size=m, gradient_accumulation_steps=batch // m,
            gradient_checkpointing=checkpointing,
        )
        for m in micros
        for checkpointing in (False, True)
    ]  # fmt: skip


def _fastest_fitting(fit: Fit, target: Target) -> Fit | None:
    """The fastest (p50) of `fit`'s same-batch variants on `target` that fits the memory."""
    fitting = [
        f for f in map(target.evaluate, same_batch_variants(fit.shape)) if f.fits_memory
    ]
    return min(fitting, key=lambda f: f.estimate.seconds_p50, default=None)


def memory_remedy(fit: Fit, target: Target) -> Fit | None:
    """The fastest run that trains what `fit` does and fits the GPU's memory, where `fit` does not.

    Gradient checkpointing, a smaller micro-batch with more accumulation, or both: each keeps
    the base as it is and the effective batch, and costs only speed. An 8B model at 4 x 2,048
    tokens without checkpointing needs about 160 GiB at p90 on one GPU; at 1 x 16 it fits an
    80 GB one. None: `fit` fits, or none of them does (then `nf4_instead`).
    """
    if fit.fits_memory:
        return None
    return _fastest_fitting(fit, target)


def nf4_instead(fit: Fit, target: Target) -> tuple[Fit, Target] | None:
    """The run on an NF4 base (QLoRA), where no 16-bit run of the same batch fits the memory.

    A 16-bit 70B base alone needs about 131 GiB on each GPU (data parallelism copies it), so
    no count of 80 GB GPUs holds it; its NF4 base is about 41 GiB. The fastest of the same-
    batch variants that fits on the NF4 base; where none does, the one of the lowest memory
    p90 (the line then says it does not fit). None: the run fits, or its base is NF4 already,
    or `memory_remedy` finds a 16-bit run that fits (the base stays as trained).
    """
    setup = target.setup or RunSetup()
    if fit.fits_memory or setup.quantization != "none" or memory_remedy(fit, target):
        return None
    quantized = dataclasses.replace(target, setup=dataclasses.replace(setup, quantization="nf4"))
    fitting = _fastest_fitting(fit, quantized)
    if fitting is not None:
        return fitting, quantized
    variants = map(quantized.evaluate, same_batch_variants(fit.shape))
    return min(variants, key=lambda f: f.estimate.memory_bound_bytes), quantized
