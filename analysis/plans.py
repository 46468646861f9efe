"""A training run as the time model sees it, and the short runs that calibrate it.

`plan_for` is the one translation of a `TrainSpec` into the time model's `Plan`: the study's
estimator, `python -m analysis.calibrate` and the time-model benchmarks all predict through
it, so a prediction is always of the run that trains. `probe_spec` is the one translation of
a probe configuration (micro-batch, accumulation, max_length, rank) into a `TrainSpec`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from analysis.timemodel import HardwareInfo, ModelProfile, Plan
from trainers.spec import LoraSpec, TrainSpec


class RunShape(Protocol):
    """The time-relevant choices of a probe or benchmark run."""

    @property
    def micro_batch_size(self) -> int: ...

    @property
    def gradient_accumulation_steps(self) -> int: ...

    @property
    def max_length(self) -> int: ...

    @property
    def lora_r(self) -> int: ...


def plan_for(
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
        epochs=spec.epochs,
        micro_batch_size=spec.micro_batch_size,
        gradient_accumulation_steps=spec.gradient_accumulation_steps,
        max_length=spec.max_length,
        lora_r=spec.lora.r,
        eval_interval_steps=spec.eval_interval,
        eval_samples=min(spec.eval_samples, n_validation),
        checkpoint_interval_steps=spec.checkpoint_interval,
        gradient_checkpointing=spec.gradient_checkpointing,
        precision=hardware.precision,
        device_kind=hardware.device_kind,
        # A trial stops early in its full run's schedule: it takes only those steps.
        max_steps=spec.stop_after_steps or spec.max_steps,
        packing=spec.packing,
        quantization=spec.quantization,
    )


def probe_spec(
    shape: RunShape,
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
        shape: Micro-batch, accumulation, max_length and rank.
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
    work = Path(work_dir)
    return TrainSpec(
        model=model,
        data=data,
        output_dir=str(work / name),
        lora=LoraSpec(r=shape.lora_r, alpha=2.0 * shape.lora_r),
        micro_batch_size=shape.micro_batch_size,
        gradient_accumulation_steps=shape.gradient_accumulation_steps,
        max_length=shape.max_length,
        max_steps=max_steps,
        eval_interval=eval_interval,
        eval_samples=eval_samples,
        checkpoint_interval=checkpoint_interval,
        device=device,
        precision=precision,
        cache_dir=str(work / "cache"),
    )
