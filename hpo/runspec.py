"""A study's configuration -> the training it becomes.

`train_spec` is the one translation of a sampled configuration into a `TrainSpec`: the
objective trains its trial with it, `hpo.export` writes the full run into the preset with
it, and the estimator predicts through it (then `analysis.plans.plan_for`). A trial and its
full run differ only in the schedule: the trial stops after `trial_max_steps` and
evaluates every `eval_interval` steps without saving; the full run trains all `epochs`,
evaluates every `full_eval_interval` and saves every `full_checkpoint_interval` steps. Both
evaluate the same `eval_samples`, so their losses are on one scale.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.errors import BadInputError
from hpo.config import StudyConfig
from trainers.spec import LoraSpec, TrainSpec

# Recorded elsewhere in the study (resolved paths), and checked only where they are read.
_PATH_FIELDS = ("model", "data", "space")


def train_spec(
    config: StudyConfig,
    params: Mapping[str, Any],
    *,
    model: str,
    data: str,
    full_run: bool,
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
        output_dir: Where the run writes. The default is `TrainSpec`'s, which is also what a
            preset's full run gets: the preset does not carry an output folder.

    Raises:
        KeyError: `params` lacks a sampled key.
        BadInputError: A value the trainer does not accept.
    """
    return TrainSpec(
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
        max_steps=None if full_run else config.trial_max_steps,
        epochs=config.epochs,
        eval_interval=config.full_eval_interval if full_run else config.eval_interval,
        eval_samples=config.eval_samples,
        checkpoint_interval=config.full_checkpoint_interval if full_run else 0,
        validation_fraction=config.validation_fraction,
        device=config.device,
        precision=config.precision,
        seed=config.seed,
        cache_dir=str(Path(config.work_dir).resolve() / "cache"),
    )


def stored_config(values: Mapping[str, Any]) -> StudyConfig:
    """The study configuration `StudyConfig.to_dict` stored with a study, read back.

    The model, data and space paths are left out: the study records the resolved model and
    data paths itself, and the export runs where those paths need not exist. Fields a later
    version no longer knows are ignored; missing ones take their defaults.

    Raises:
        BadInputError: A stored value the configuration no longer accepts.
    """
    known = {f.name for f in dataclasses.fields(StudyConfig)} - set(_PATH_FIELDS)
    try:
        return StudyConfig(**{k: v for k, v in values.items() if k in known})
    except TypeError as exc:
        raise BadInputError(f"the study's stored configuration: {exc}") from exc
