"""A study's configuration -> the training it becomes.

`train_spec` is the one translation of a sampled configuration into a `TrainSpec`: the
objective trains its trial with it, `hpo.export` writes the full run into the preset with
it, and the estimator predicts through it (then `analysis.plans.plan_for`).

A trial is the start of its own full run: the same schedule (warm-up and decay horizon
from the full run's step count), the same data order, cut short after `trial_fraction` of
the full run's training samples (`TrainSpec.stop_after_steps`). Fidelity is therefore
counted in data, not in optimizer steps: at a fixed step count a larger effective batch
has seen more samples and wins by construction. The trial evaluates `trial_evals` times,
evenly spaced, and saves one checkpoint at its last step, so that the time model measures
what a save costs on this machine (the objective deletes it afterwards); the full run
evaluates every `full_eval_interval` and saves every `full_checkpoint_interval` steps. Both evaluate the same `eval_samples` at the
study's one `eval_max_length`, so every loss of a study is on one scale.

A packed configuration (`packing: padding_free`) takes its micro-batches from packed
sequences, not samples: its steps are counted over the sequences the trainer's own packer
(`trainers.data.packing.pack_lengths`, which the time model's plan uses too) makes of the
training samples' token lengths at its `max_length` (`full_run_steps`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import from_mapping
from hpo.config import StudyConfig
from trainers.data.packing import pack_lengths
from trainers.spec import LoraSpec, TrainSpec, optimizer_steps

# Recorded elsewhere in the study (resolved paths), and checked only where they are read.
_PATH_FIELDS = ("model", "data", "space")


@dataclass(frozen=True)
class TrialSchedule:
    """Where a trial stops in its full run's schedule, and how often it evaluates.

    Attributes:
        stop_after_steps: Optimizer steps the trial trains (<= the full run's steps).
        eval_interval: Steps between evaluations (the trial also evaluates at its end).
        evals: Evaluations in the trial.
    """

    stop_after_steps: int
    eval_interval: int
    evals: int


def trial_schedule(full_run_steps: int, *, fraction: float, evals: int) -> TrialSchedule:
    """The trial's share of its full run: `fraction` of the steps, about `evals` evaluations.

    The trial's length is the share rounded to whole steps, so configurations see the same
    data to within one optimizer step; it evaluates every `eval_interval` steps and once
    more at its end. With fewer steps than `evals` it evaluates after every step.
    """
    stop = min(full_run_steps, max(1, round(fraction * full_run_steps)))
    interval = max(1, stop // evals)
    return TrialSchedule(stop_after_steps=stop, eval_interval=interval, evals=-(-stop // interval))


def training_items(spec: TrainSpec, train_lengths: Sequence[int]) -> int:
    """Micro-batch slots of one epoch: the samples, or the packed sequences made of them.

    Args:
        spec: The run (its `packing` and `max_length`).
        train_lengths: Token lengths of the training samples at `spec.max_length`.
    """
    if spec.packing == "padding_free":
        return len(pack_lengths([min(n, spec.max_length) for n in train_lengths], spec.max_length))
    return len(train_lengths)


def full_run_steps(spec: TrainSpec, train_lengths: Sequence[int]) -> int:
    """Optimizer steps of `spec`'s schedule, over packed sequences where it packs."""
    return optimizer_steps(spec, training_items(spec, train_lengths))


def train_spec(
    config: StudyConfig,
    params: Mapping[str, Any],
    *,
    model: str,
    data: str,
    full_run: bool,
    train_samples: int | None = None,
    train_lengths: Sequence[int] | None = None,
    fraction: float | None = None,
    output_dir: str = "train-output",
) -> TrainSpec:
    """The training a configuration becomes: a short trial, or the full run of the preset.

    Args:
        config: The study's configuration (schedule, evaluation, device, seed).
        params: The sampled configuration (`search_spaces.sample`), or a trial's user
            attributes, which hold it.
        model: The model folder (the study's resolved path).
        data: The JSONL data (the study's resolved path).
        full_run: The full run instead of the trial.
        train_samples: Training samples of the data (after the validation split): the
            trial's length is a share of its full run's steps. A trial needs this or
            `train_lengths`; a packed trial needs `train_lengths`.
        train_lengths: Token lengths of the training samples at the configuration's
            `max_length`: a packed trial's full run counts packed sequences.
        fraction: The trial's share of the full run; default `config.trial.fraction`
            (a promoted trial trains `config.trial.promote_fraction`).
        output_dir: Where the run writes. The default is `TrainSpec`'s, which is also what a
            preset's full run gets: the preset does not carry an output folder.

    Raises:
        KeyError: `params` lacks a sampled key.
        BadInputError: A value the trainer does not accept.
        ValueError: A trial without the training data's size (or lengths, when packed).
    """
    spec = TrainSpec(
        model=model,
        data=data,
        output_dir=output_dir,
        lora=LoraSpec(
            r=int(params["lora_r"]),
            alpha=float(params["lora_alpha"]),
            dropout=float(params["lora_dropout"]),
        ),
        micro_batch_size=int(params["micro_batch_size"]),
        gradient_accumulation_steps=int(params["gradient_accumulation_steps"]),
        learning_rate=float(params["learning_rate"]),
        weight_decay=float(params.get("weight_decay", 0.0)),
        warmup_ratio=float(params.get("warmup_ratio", 0.0)),
        max_length=int(params["max_length"]),
        gradient_checkpointing=bool(params["gradient_checkpointing"]),
        packing=str(params.get("packing", "none")),
        quantization=str(params.get("quantization", "none")),
        epochs=config.full_run.epochs,
        eval_interval=config.full_run.eval_interval,
        eval_samples=config.eval_samples,
        eval_max_length=config.eval_max_length,
        checkpoint_interval=config.full_run.checkpoint_interval,
        validation_fraction=config.validation_fraction,
        device=config.device,
        precision=config.precision,
        seed=config.seed,
        cache_dir=str(Path(config.work_dir).resolve() / "cache"),
    )
    if full_run:
        return spec
    if train_lengths is not None:
        full_steps = full_run_steps(spec, train_lengths)
    elif train_samples is None or spec.packing != "none":
        raise ValueError(
            "a trial needs train_lengths (or train_samples when unpacked): its length is a "
            "share of its full run"
        )
    else:
        full_steps = optimizer_steps(spec, train_samples)
    share = config.trial.fraction if fraction is None else fraction
    schedule = trial_schedule(
        full_steps,
        fraction=share,
        # A longer (promoted) trial keeps the first trial's density of points.
        evals=max(config.trial.evals, round(config.trial.evals * share / config.trial.fraction)),
    )
    return dataclasses.replace(
        spec,
        stop_after_steps=schedule.stop_after_steps,
        eval_interval=schedule.eval_interval,
        # One save, at the end: its measured time calibrates the full run's saves.
        checkpoint_interval=schedule.stop_after_steps,
    )


def stored_config(values: Mapping[str, Any]) -> StudyConfig:
    """The study configuration `StudyConfig.to_dict` stored with a study, read back.

    The model, data and space paths are left out: the study records the resolved model and
    data paths itself, and the export runs where those paths need not exist. Fields a later
    version no longer knows are ignored; missing ones take their defaults.

    Raises:
        BadInputError: A stored value the configuration no longer accepts.
    """
    kept = {key: value for key, value in values.items() if key not in _PATH_FIELDS}
    return from_mapping(
        StudyConfig, kept, "the study's stored configuration", ignore_unknown=True
    )
