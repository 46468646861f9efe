"""A study's configuration -> the training it becomes: the full run, or a trial cut from it.

`full_run` translates a sampled configuration and the study's settings into the full run's
`TrainSpec` (through `trainers.run_spec.run_spec`); `trial_runs` builds it with the trial cut
from it (`trial_spec`). The objective trains its trial with them, the estimator predicts
through them (then `analysis.planning.fits.plan_of_spec`), and `hpo.export` writes the full
run into the preset.

A trial is the start of its own full run: the same schedule (warm-up and decay horizon
from the full run's step count), the same data order, cut short after `trial.fraction` of
the full run's training samples (`TrainSpec.stop_after_steps`). Fidelity is therefore
counted in data, not in optimizer steps: at a fixed step count a larger effective batch
has seen more samples and wins by construction. The trial evaluates `trial.evals` times,
evenly spaced, and saves one checkpoint at its last step, so that the time model measures
what a save costs on this machine (the objective deletes it afterwards); the full run
evaluates every `full_run.eval_interval` and saves every `full_run.checkpoint_interval`
steps. Both evaluate the same `eval_samples` at the study's one `eval_max_length`, so
every loss of a study is on one scale.

A full run on N GPUs (`budget.gpus_per_run`, data-parallel: the micro-batch and the
accumulation are each GPU's) has its trial train on one GPU with the accumulation x N
(`on_one_gpu`): the same effective batch and, step for step, the same samples, since the
sharded sampler gives process k the micro-batches k, k+N, ... of the one shuffled order, so a
step's a x N micro-batches are the same set in both. Its steps per epoch are equal too:
ceil(ceil(S / (m N)) / a) = ceil(S / (m a N)) = ceil(ceil(S / m) / (a N)). Grouped by length
(`packing: group_by_length`) the order is one too: the trainer's sampler groups a whole
step's m x a x N samples in both. The time model
plans the trial on one GPU and the full run on N (all-reduce, the slowest GPU's wait, cost x
N), and the memory it checks is the full run's per GPU (the trial's plus DDP's buckets).

A packed configuration (`packing: padding_free`) takes its micro-batches from packed
sequences, not samples: its steps are counted over the sequences the trainer's own packer
makes of the training samples' token lengths (`trainers.spec.full_run_steps`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import from_mapping
from hpo.config import StudyConfig
from trainers.run_spec import run_spec
from trainers.spec import TrainSpec, full_run_steps, optimizer_steps

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


def on_one_gpu(run: TrainSpec) -> TrainSpec:
    """`run` on one GPU with its effective batch and schedule: the accumulation x its GPUs.

    A study's trials (and its reference run) train so: the study runs on one GPU, and a
    trial must stay the start of its full run on `run.gpus` GPUs (the module says why).
    """
    if run.gpus == 1:
        return run
    return dataclasses.replace(
        run, gpus=1, gradient_accumulation_steps=run.gradient_accumulation_steps * run.gpus
    )


def trial_spec(
    config: StudyConfig,
    full_run: TrainSpec,
    full_steps: int,
    *,
    fraction: float | None = None,
    output_dir: str | Path | None = None,
) -> TrainSpec:
    """The trial of `full_run`: its start, cut at `fraction` of its `full_steps` steps, on
    one GPU (`on_one_gpu`).

    Args:
        config: The study's configuration (the trial's share and evaluations).
        full_run: The full run the trial is the start of.
        full_steps: The full run's optimizer steps (`trainers.spec.full_run_steps`).
        fraction: The trial's share of the full run; default `config.trial.fraction`
            (a promoted trial trains `config.trial.promote_fraction`).
        output_dir: Where the trial writes; default: where the full run would.
    """
    trial = config.trial
    share = trial.fraction if fraction is None else fraction
    schedule = trial_schedule(
        full_steps,
        fraction=share,
        # A longer (promoted) trial keeps the first trial's density of points.
        evals=max(trial.evals, round(trial.evals * share / trial.fraction)),
    )
    return dataclasses.replace(
        on_one_gpu(full_run),
        output_dir=full_run.output_dir if output_dir is None else str(output_dir),
        stop_after_steps=schedule.stop_after_steps,
        eval_interval=schedule.eval_interval,
        # One save, at the end: its measured time calibrates the full run's saves.
        checkpoint_interval=schedule.stop_after_steps,
    )


def full_run(
    config: StudyConfig,
    params: Mapping[str, Any],
    *,
    model: str,
    data: str,
    output_dir: str | Path = "train-output",
) -> TrainSpec:
    """The full run a configuration becomes under the study's settings (all its epochs).

    Args:
        config: The study's configuration (schedule, evaluation, device, seed, GPUs).
        params: The sampled configuration (`search_spaces.sample`), or a trial's user
            attributes, which hold it.
        model: The model folder (the study's resolved path).
        data: The training data (the study's resolved path).
        output_dir: Where the run writes (see `trainers.run_spec.run_spec`).

    Raises:
        KeyError: `params` lacks `lora_r`.
        BadInputError: A value the trainer does not accept.
    """
    return run_spec(params, config, model=model, data=data, output_dir=output_dir)


@dataclass(frozen=True)
class TrialRuns:
    """A configuration's full run and the trial cut from it.

    Attributes:
        full_run: The full run (on the study's GPUs per run).
        trial: Its start, on one GPU (`trial_spec`).
        full_run_steps: The full run's optimizer steps (the trial's share is of these).
    """

    full_run: TrainSpec
    trial: TrainSpec
    full_run_steps: int


def trial_runs(
    config: StudyConfig,
    params: Mapping[str, Any],
    *,
    model: str,
    data: str,
    train_lengths: Callable[[int], Sequence[int]] | None = None,
    train_samples: int | None = None,
    fraction: float | None = None,
    output_dir: str | Path | None = None,
) -> TrialRuns:
    """The full run a configuration becomes and its trial: the one place both are built.

    The objective trains the trial, the estimator predicts both, the reference run and the
    export take the full run (`full_run`) from here.

    Args:
        config: The study's configuration (schedule, evaluation, device, seed, GPUs).
        params: The sampled configuration, or a trial's user attributes.
        model: The model folder (the study's resolved path).
        data: The training data (the study's resolved path).
        train_lengths: Token lengths of the training samples at a `max_length`
            (`StudyEstimator.train_lengths`): a packed full run counts packed sequences.
        train_samples: Training samples of the data (after the validation split), for an
            unpacked run when the lengths are not at hand.
        fraction: The trial's share of the full run (see `trial_spec`).
        output_dir: Where the trial writes; default: where the full run would.

    Raises:
        KeyError: `params` lacks `lora_r`.
        BadInputError: A value the trainer does not accept.
        ValueError: Neither `train_lengths` nor (unpacked) `train_samples`: the trial's
            length is a share of its full run.
    """
    full = full_run(config, params, model=model, data=data)
    if train_lengths is not None:
        steps = full_run_steps(full, train_lengths(full.max_length))
    elif train_samples is None or full.packing == "padding_free":
        raise ValueError(
            "a trial needs train_lengths (or train_samples when unpacked): its length is a "
            "share of its full run"
        )
    else:
        steps = optimizer_steps(full, train_samples)
    trial = trial_spec(config, full, steps, fraction=fraction, output_dir=output_dir)
    return TrialRuns(full_run=full, trial=trial, full_run_steps=steps)


def stored_config(values: Mapping[str, Any]) -> StudyConfig:
    """The study configuration `StudyConfig.to_dict` stored with a study, read back.

    The model, data and space paths are left out: the study records the resolved model and
    data paths itself, and the export runs where those paths need not exist. Fields a later
    version no longer knows are ignored; missing ones take their defaults.

    Raises:
        BadInputError: A stored value the configuration no longer accepts.
    """
    kept = {key: value for key, value in values.items() if key not in _PATH_FIELDS}
    return from_mapping(StudyConfig, kept, "the study's stored configuration", ignore_unknown=True)
