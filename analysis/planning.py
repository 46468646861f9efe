"""Plan a full LoRA run before any download: a model's `config.json`, a GPU, a data size.

The model is profiled on PyTorch's meta device (`analysis.machine.config_profile`, the same
profile a study computes from a downloaded model), the run is translated by
`analysis.plans.plan_for` and predicted by `analysis.timemodel.predict`: a plan is what the
study would predict for that run on that GPU, with the priors a study there starts from, or
with a calibration measured on that GPU.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from analysis import fitted_priors
from analysis.calibration.file import Calibration, load
from analysis.gpus import GpuSpec, peak_of
from analysis.plans import plan_for
from analysis.run_setup import ATTENTION_RATE, MemoryTerms, RunSetup, peak_memory
from analysis.timemodel import (
    Coefficients,
    Estimate,
    ModelProfile,
    Plan,
    predict,
    prior_coefficients,
)
from common.errors import BadInputError
from trainers.spec import (
    STUDY_EVAL_SAMPLES,
    STUDY_FULL_CHECKPOINT_INTERVAL,
    STUDY_FULL_EVAL_INTERVAL,
    LoraSpec,
    TrainSpec,
)

CHARS_PER_TOKEN = 4.0  # English text under a BPE tokenizer, when no tokenizer is given
VALIDATION_FRACTION = 0.1  # as a study holds out by default


def shipped_configs() -> dict[str, Path]:
    """The published model configurations shipped with the package, by file stem."""
    folder = Path(str(resources.files("analysis").joinpath("model_configs")))
    return {path.stem: path for path in sorted(folder.glob("*.json"))}


def load_model_config(path: str | Path) -> Any:
    """Read a causal LM's `config.json` (or the folder holding one) without any weights.

    Raises:
        BadInputError: Missing, not JSON, or not a configuration transformers knows; one line.
    """
    from transformers import AutoConfig

    source = Path(path)
    if source.is_dir():
        source = source / "config.json"
    if not source.is_file():
        raise BadInputError(f"--model-config: no such file: {path}")
    try:
        raw = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(f"--model-config: {source} is not JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise BadInputError(f"--model-config: {source} has no model_type (not a config.json)")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if raw["model_type"] not in CONFIG_MAPPING:
        raise BadInputError(
            f"--model-config: {source}: model_type {raw['model_type']!r} is not one this "
            "transformers knows"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return AutoConfig.for_model(**raw)
        except (ValueError, KeyError, TypeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BadInputError(f"--model-config: {source}: {first}") from None


# ----------------------------------------------------------------------------- data


def lengths_from_count(samples: int, tokens_per_sample: int) -> tuple[int, ...]:
    """Train token lengths of `samples` samples of `tokens_per_sample` tokens each."""
    if samples < 2:
        raise BadInputError(f"--samples must be >= 2, but got {samples}")
    if tokens_per_sample < 1:
        raise BadInputError(f"--tokens-per-sample must be >= 1, but got {tokens_per_sample}")
    n_validation = max(1, round(samples * VALIDATION_FRACTION))
    return (tokens_per_sample,) * (samples - n_validation)


def lengths_from_data(
    data: str, *, max_length: int, tokenizer_dir: str | None, cache_dir: str | None = None
) -> tuple[tuple[int, ...], str]:
    """Train token lengths of a data set (see `trainers.data.sources`), and how they were measured.

    With a tokenizer folder the file goes through the trainer's own tokenization (exact);
    without one, each record's characters / `CHARS_PER_TOKEN` stand for its tokens.
    """
    from trainers.data.dataset import DataSpec, load_tokenized, split_indices

    if tokenizer_dir:
        from trainers.model.lora import load_tokenizer

        spec = DataSpec(path=data, max_length=max_length, cache_dir=cache_dir)
        loaded = load_tokenized(spec, load_tokenizer(tokenizer_dir))
        return tuple(loaded.stats.lengths[: len(loaded.train)]), f"tokenized ({tokenizer_dir})"
    chars = _record_characters(Path(data))
    train, _ = split_indices(len(chars), VALIDATION_FRACTION, 0)
    lengths = tuple(max(1, math.ceil(chars[i] / CHARS_PER_TOKEN)) for i in train)
    return lengths, f"estimated at {CHARS_PER_TOKEN:g} characters per token (no --tokenizer)"


def _record_characters(path: Path) -> list[int]:
    """Characters of text in each record of a data set, in any format and shape it can have."""
    from trainers.data.records import read_native

    try:
        _, records, _ = read_native(path)
    except BadInputError as error:
        raise BadInputError(f"--data: {error}") from None
    counts = []
    for record in records:
        texts = [record.get("text"), record.get("prompt"), record.get("completion")]
        texts += [m["content"] for m in record.get("messages") or []]
        counts.append(sum(len(t) for t in texts if isinstance(t, str)))
    if len(counts) < 2:
        raise BadInputError(f"--data: {path} has {len(counts)} record(s); a run needs 2")
    return counts


# ----------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class RunShape:
    """The choices that set a run's duration and memory."""

    micro_batch_size: int
    gradient_accumulation_steps: int
    max_length: int
    lora_r: int
    gradient_checkpointing: bool = False
    epochs: float = 1.0


def plan_of(shape: RunShape, model: ModelProfile, lengths: Sequence[int], gpu: GpuSpec) -> Plan:
    """The time model's plan of a full run of `shape` (the study's intervals and evaluation)."""
    spec = TrainSpec(
        model="config.json",
        data="data.jsonl",
        lora=LoraSpec(r=shape.lora_r, alpha=2.0 * shape.lora_r),
        micro_batch_size=shape.micro_batch_size,
        gradient_accumulation_steps=shape.gradient_accumulation_steps,
        max_length=shape.max_length,
        epochs=shape.epochs,
        eval_interval=STUDY_FULL_EVAL_INTERVAL,
        eval_samples=STUDY_EVAL_SAMPLES,
        checkpoint_interval=STUDY_FULL_CHECKPOINT_INTERVAL,
        gradient_checkpointing=shape.gradient_checkpointing,
    )
    clipped = [min(n, shape.max_length) for n in lengths]
    return plan_for(spec, model, clipped, n_validation=STUDY_EVAL_SAMPLES, hardware=gpu.hardware())


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
        kind = "its" if gpu.name in fitted.utilisation else "the pooled"
        where = (
            f"priors for {gpu.name} ({peak / 1e12:g} TFLOP/s {gpu.precision} peak; {kind} "
            f"utilisation {fitted.utilisation_for(gpu):.2f} fitted to "
            f"{len(fitted.fitted_points)} published runs, band "
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
        packing="padding_free" if setup.packing else "none",
        quantization=setup.quantization,
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
    peak memory is `analysis.run_setup.peak_memory` with `memory` terms, and the attention
    kernel sets the attention FLOPs' rate; without one, the time model's own memory estimate.
    """
    plan = plan_of(shape, model, lengths, gpu)
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
        estimate = dataclasses.replace(
            estimate, peak_memory_bytes=int(p50), peak_memory_bytes_p90=int(p90)
        )
    fits_memory = estimate.peak_memory_bytes_p90 <= gpu.memory_gib * 2**30
    window = None if window_hours is None else estimate.seconds_p90 <= window_hours * 3600
    return Fit(shape, estimate, fits_memory, window)


def best_of_profile(
    profile: Any,
    *,
    lora_r: int,
    epochs: float,
    model: ModelProfile,
    lengths: Sequence[int],
    gpu: GpuSpec,
    coefficients: Coefficients,
    window_hours: float | None,
    max_length: int | None = None,
    setup: RunSetup | None = None,
    memory: MemoryTerms | None = None,
) -> Fit:
    """The profile's fastest fitting micro-batch x accumulation (by p90), else its leanest.

    Args:
        profile: A `search_spaces.Profile`.
        max_length: Instead of the profile's own.
    """
    fits = [
        evaluate(
            RunShape(
                micro_batch_size=mb,
                gradient_accumulation_steps=ga,
                max_length=max_length or profile.max_length,
                lora_r=lora_r,
                gradient_checkpointing=profile.gradient_checkpointing,
                epochs=epochs,
            ),
            model,
            lengths,
            gpu,
            coefficients,
            window_hours=window_hours,
            setup=setup,
            memory=memory,
        )
        for mb in profile.micro_batch_size
        for ga in profile.gradient_accumulation_steps
    ]
    fitting = [f for f in fits if f.fits]
    if fitting:
        return min(fitting, key=lambda f: f.estimate.seconds_p90)
    return min(fits, key=lambda f: f.estimate.peak_memory_bytes_p90)


def toggled_checkpointing(
    fit: Fit,
    model: ModelProfile,
    lengths: Sequence[int],
    gpu: GpuSpec,
    coefficients: Coefficients,
    window_hours: float | None,
    setup: RunSetup | None = None,
    memory: MemoryTerms | None = None,
) -> Fit:
    """The same run with gradient checkpointing switched the other way."""
    shape = dataclasses.replace(
        fit.shape, gradient_checkpointing=not fit.shape.gradient_checkpointing
    )
    return evaluate(
        shape, model, lengths, gpu, coefficients, window_hours=window_hours, setup=setup,
        memory=memory,
    )  # fmt: skip
