"""The one translation of a configuration into the `TrainSpec` it trains.

A run is two things: what was chosen for it (a study's sampled configuration, a planned
run shape, a probe point: the adapter, the batch, the length, the rate) and what it shares
with every run of its study (the full run's epochs and cadence, the evaluation, the
machine, the seed, the work dir). `run_spec` joins the two. The study (`hpo.trial_runs`, which
cuts a trial out of its full run), `hpo.export`, the estimator, `analysis.planning.fits`, the
probe and the benchmarks all build their runs here, so a prediction is always of the run
that trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from common.workdir import WorkDir
from trainers.spec import LoraSpec, TrainSpec

# What a run takes from its settings and its settings' full run, each a `TrainSpec` field.
_SHARED = (
    "eval_samples", "eval_max_length", "validation_fraction", "validation_split", "data_columns",
    "device", "precision", "seed",
)  # fmt: skip
_FULL_RUN = ("epochs", "eval_interval", "checkpoint_interval")
# The sampled keys a run reads, each a `TrainSpec` field; a key a choice lacks takes the
# field's default (and `lora_alpha` twice the rank).
_RUN_KEYS = {
    "micro_batch_size": int,
    "gradient_accumulation_steps": int,
    "learning_rate": float,
    "weight_decay": float,
    "warmup_ratio": float,
    "max_length": int,
    "gradient_checkpointing": bool,
    "packing": str,
    "quantization": str,
    "gpus": int,
}


class FullRunSchedule(Protocol):
    """How long the full run trains, and how often it evaluates and saves."""

    @property
    def epochs(self) -> float: ...

    @property
    def eval_interval(self) -> int: ...

    @property
    def checkpoint_interval(self) -> int: ...


class RunSettings(Protocol):
    """What a run takes from its study rather than from its choice.

    `hpo.config.StudyConfig` is one; `Settings` is one for runs outside a study.
    """

    @property
    def full_run(self) -> FullRunSchedule: ...

    @property
    def eval_samples(self) -> int: ...

    @property
    def eval_max_length(self) -> int | None: ...

    @property
    def validation_fraction(self) -> float: ...

    @property
    def validation_split(self) -> str | None: ...

    @property
    def data_columns(self) -> str | None: ...

    @property
    def device(self) -> str: ...

    @property
    def precision(self) -> str: ...

    @property
    def seed(self) -> int: ...

    @property
    def gpus(self) -> int:
        """GPUs the full run trains on, data-parallel (a choice's own `gpus` wins)."""
        ...

    @property
    def work_dir(self) -> str | Path | None: ...


@dataclass(frozen=True)
class Settings:
    """`RunSettings` of a run outside a study (a plan, a probe, a benchmark).

    The defaults are `TrainSpec`'s. `work_dir` holds the tokenized cache (None: the
    project's cache root).
    """

    work_dir: str | Path | None = None
    epochs: float = TrainSpec.epochs
    eval_interval: int = TrainSpec.eval_interval
    checkpoint_interval: int = TrainSpec.checkpoint_interval
    eval_samples: int = TrainSpec.eval_samples
    eval_max_length: int | None = None
    validation_fraction: float = TrainSpec.validation_fraction
    validation_split: str | None = None
    data_columns: str | None = None
    device: str = TrainSpec.device
    precision: str = TrainSpec.precision
    seed: int = TrainSpec.seed
    gpus: int = TrainSpec.gpus

    @property
    def full_run(self) -> Settings:
        """Its own epochs and cadence."""
        return self


def run_spec(
    choice: Mapping[str, Any],
    settings: RunSettings,
    *,
    model: str,
    data: str,
    output_dir: str | Path = "train-output",
    max_steps: int | None = None,
) -> TrainSpec:
    """The full run of `choice` under `settings`.

    Args:
        choice: The run's own values by sampled key (`search_spaces.sample`, a trial's user
            attributes, `dataclasses.asdict` of a run shape): `lora_r` and any of
            `lora_alpha` (default twice the rank), `lora_dropout`, `micro_batch_size`,
            `gradient_accumulation_steps`, `learning_rate`, `weight_decay`, `warmup_ratio`,
            `max_length`, `gradient_checkpointing`, `packing`, `quantization`, `gpus`; a key
            it lacks takes `TrainSpec`'s default (`gpus`: the settings'), and other keys are
            not read.
        settings: What the run shares with its study.
        model: The model folder.
        data: The training data.
        output_dir: Where the run writes. The default is `TrainSpec`'s, which is also what a
            preset's full run gets: the preset does not carry an output folder.
        max_steps: Optimizer steps instead of the epochs (a probe, a benchmark).

    Raises:
        KeyError: `choice` has no `lora_r`.
        BadInputError: A value the trainer does not accept.
    """
    rank = int(choice["lora_r"])
    lora = LoraSpec(
        r=rank,
        alpha=float(choice.get("lora_alpha", 2.0 * rank)),
        dropout=float(choice.get("lora_dropout", LoraSpec.dropout)),
    )
    chosen: dict[str, Any] = {"gpus": settings.gpus}
    chosen.update({k: kind(choice[k]) for k, kind in _RUN_KEYS.items() if k in choice})
    shared = {name: getattr(settings, name) for name in _SHARED}
    full_run = {name: getattr(settings.full_run, name) for name in _FULL_RUN}
    work_dir = settings.work_dir
    return TrainSpec(
        model=model,
        data=data,
        output_dir=str(output_dir),
        lora=lora,
        max_steps=max_steps,
        cache_dir=None if work_dir is None else str(WorkDir(work_dir).cache),
        **chosen,
        **shared,
        **full_run,
    )
