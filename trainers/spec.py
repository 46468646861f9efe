"""The typed, validated description of one training run."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from common.checks import require, require_choice, require_int
from common.config import from_mapping, knob, part, parts_from_mappings

if TYPE_CHECKING:
    from trainers.data.dataset import DataSpec

SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda", "mps")
# What a study's full run evaluates and saves unless its config says otherwise: the
# defaults of `hpo.config.StudyConfig`, and what `analysis.plan` plans with.
STUDY_EVAL_SAMPLES = 48
STUDY_FULL_EVAL_INTERVAL = 200
STUDY_FULL_CHECKPOINT_INTERVAL = 500
OVERFLOW_MODES = ("truncate", "pack")
PACKING_MODES = ("none", "padding_free", "group_by_length")  # trainers.data.packing
QUANTIZATION_MODES = ("none", "nf4")  # trainers.model.quantization
LEVER_MODES = ("auto", "on", "off")  # trainers.model.levers


@dataclass(frozen=True)
class LoraSpec:
    """LoRA adapter settings (PEFT's `LoraConfig` is built from these)."""

    r: int = knob(8, "Adapter rank.", at_least=1)
    alpha: float = knob(16.0, "Scaling numerator (scale = alpha / r).", above=0)
    dropout: float = knob(0.05, "Dropout on the adapter input.", at_least=0, below=1)
    use_rslora: bool = knob(False, "Scale by alpha / sqrt(r).")
    target_modules: str | tuple[str, ...] = knob(
        "auto",
        "'auto' (every linear projection of attention and MLP) or module names.",
        flag="targets",
    )

    def __post_init__(self) -> None:
        require_int("lora.r", self.r, 1)
        require(self.alpha > 0, f"lora.alpha must be > 0, but got {self.alpha=}")
        require(
            0.0 <= self.dropout < 1.0, f"lora.dropout must be in [0, 1), but got {self.dropout=}"
        )
        if isinstance(self.target_modules, list):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if isinstance(self.target_modules, str):
            require(
                bool(self.target_modules),
                f"lora.target_modules must be 'auto' or names, but got {self.target_modules=}",
            )
        else:
            require(
                len(self.target_modules) > 0
                and all(isinstance(t, str) for t in self.target_modules),
                f"lora.target_modules must be a non-empty list of names, but got {self.target_modules=}",
            )


@dataclass(frozen=True)
class RecoverySpec:
    """What a run does when it runs out of memory or its loss blows up (off: it fails)."""

    enabled: bool = knob(
        False,
        "Recover (halve the micro-batch, roll back) instead of failing.",
        flag="recovery",
    )
    max_rollbacks: int = knob(
        3, "Rollbacks after NaN/inf or divergence before giving up.", at_least=0
    )
    lr_factor: float = knob(
        0.5,
        "Learning-rate multiplier applied at each rollback.",
        flag="rollback-lr-factor",
        above=0,
        below=1,
    )
    divergence_ratio: float = knob(
        1.5,
        "A validation loss above ratio x its running minimum is diverging.",
        above=1,
    )
    divergence_evals: int = knob(
        3, "Consecutive diverging evaluations that trigger a rollback.", at_least=1
    )

    def __post_init__(self) -> None:
        require_int("recovery.max_rollbacks", self.max_rollbacks, 0)
        require(
            0.0 < self.lr_factor < 1.0,
            f"recovery.lr_factor must be in (0, 1), but got {self.lr_factor=}",
        )
        require(
            self.divergence_ratio > 1.0,
            f"recovery.divergence_ratio must be > 1, but got {self.divergence_ratio=}",
        )
        require_int("recovery.divergence_evals", self.divergence_evals, 1)


@dataclass(frozen=True)
class TrainSpec:
    """Everything one training run needs. Validated on construction."""

    model: str = field(metadata={"help": "Local path of a transformers causal LM."})
    data: str = field(
        metadata={
            "help": "JSONL, Parquet, CSV or JSON file, a folder of them (its train split) or a "
            "Dataset.save_to_disk folder (text, "
            "prompt/completion, messages, Alpaca or ShareGPT records)."
        }
    )
    output_dir: str = knob("train-output", "Checkpoints and logs.")
    lora: LoraSpec = part(LoraSpec, "LoRA adapter settings.", flag_prefix="lora-")
    micro_batch_size: int = knob(8, "Samples per forward/backward.", at_least=1)
    gradient_accumulation_steps: int = knob(1, "Micro-batches per optimizer step.", at_least=1)
    gpus: int = knob(
        1,
        "Processes training this run data-parallel, one per GPU (one per CPU process with "
        "--device cpu): each optimizer step takes micro_batch_size x "
        "gradient_accumulation_steps samples on each, so the effective batch is N times "
        "larger. trainers.train starts them itself (through torchrun) unless it was launched "
        "by torchrun or accelerate launch with as many processes.",
        at_least=1,
    )
    learning_rate: float = knob(1e-3, "Peak learning rate.", above=0, below=1)
    weight_decay: float = knob(0.0, "AdamW weight decay.", at_least=0)
    scheduler: str = knob("linear", f"Learning-rate schedule: {' | '.join(SCHEDULERS)}.")
    warmup_ratio: float = knob(
        0.0, "Share of the optimizer steps spent warming up.", at_least=0, below=1
    )
    max_steps: int | None = knob(None, "Optimizer steps; overrides epochs when set.", at_least=1)
    epochs: float = knob(1.0, "Passes over the training set.", above=0)
    max_length: int = knob(128, "Tokens per training sample.", at_least=1)
    eval_max_length: int | None = knob(
        None,
        "Tokens per validation sample (none: max_length). A study sets one length for every "
        "run, so all its losses are on one scale.",
        at_least=1,
    )
    overflow: str = knob("truncate", f"Samples over max_length: {' | '.join(OVERFLOW_MODES)}.")
    packing: str = knob(
        "none",
        "Training samples per sequence: none (one, padded per micro-batch) | padding_free "
        "(packed up to max_length tokens, attention kept inside each sample; micro_batch_size "
        "then counts packed sequences) | group_by_length (one, padded per micro-batch, whose "
        "samples are of about one length: transformers' length-grouped sampler). Validation "
        "is never packed.",
    )
    skip_bad_lines: bool = knob(False, "Skip malformed records instead of failing.")
    validation_fraction: float = knob(
        0.1, "Share of the samples held out for validation.", above=0, below=1
    )
    validation_split: str | None = knob(
        None,
        "A split of a data folder (a Hub dataset's validation or test) or of a saved "
        "DatasetDict to validate on, instead of validation_fraction of the train split.",
    )
    data_columns: str | None = knob(
        None,
        "The data's columns read as hpo's fields, FIELD=COLUMN joined by commas (Dolly's: "
        "instruction=instruction,input=context,output=response).",
    )
    eval_interval: int = knob(
        50, "Optimizer steps between evaluations (0: only at the end).", at_least=0
    )
    eval_samples: int = knob(64, "Validation samples per evaluation.", at_least=1)
    checkpoint_interval: int = knob(0, "Optimizer steps between checkpoints (0: none).", at_least=0)
    stop_after_steps: int | None = knob(
        None,
        "Stop after this many optimizer steps of the schedule (a trial is the start of its "
        "full run: same schedule, same data order, cut short).",
        at_least=1,
    )
    checkpoint_minutes: float = knob(
        0.0, "Minutes between checkpoints (0: by steps only).", at_least=0
    )
    keep_checkpoints: int = knob(
        2, "Latest checkpoints kept (the best one is kept as well).", at_least=1
    )
    max_grad_norm: float = knob(
        1.0,
        "Clip the gradient norm to this before each update (0: no clipping).",
        at_least=0,
    )
    early_stopping_patience: int = knob(
        0,
        "Stop when the validation loss has not improved by early_stopping_min_delta for this "
        "many evaluations (0: off; a full run from trainers.train defaults to 5).",
        at_least=0,
    )
    early_stopping_min_delta: float = knob(
        1e-3,
        "The least drop of the validation loss that counts as improving.",
        at_least=0,
    )
    dataloader_workers: int | None = knob(
        None,
        "Data-loader worker processes (none: chosen from the device and CPU count).",
        at_least=0,
    )
    recovery: RecoverySpec = part(
        RecoverySpec,
        "What the run does on out-of-memory errors and a diverging loss.",
    )
    precision: str = knob("auto", f"Training precision: {' | '.join(PRECISIONS)}.")
    device: str = knob("auto", f"Training device: {' | '.join(DEVICES)}.")
    quantization: str = knob(
        "none",
        "Base model weights: none (training precision) | nf4 (QLoRA: 4-bit NormalFloat with "
        "double quantization through bitsandbytes, computing in the training precision; needs "
        "the qlora extra).",
    )
    gradient_checkpointing: bool = knob(False, "Recompute activations: less memory, slower steps.")
    compile: bool = knob(False, "torch.compile the model (CUDA).")
    liger: str = knob(
        "auto",
        "Liger kernels (CUDA, liger-kernel installed): auto | on | off. auto: on only once a "
        "GPU lease measured them faster (trainers.model.levers).",
    )
    sdpa_fast_path: str = knob(
        "auto",
        "A sliding-window model whose rows fit its window attends as plain causal (SDPA "
        "is_causal): auto | on | off. auto: on only once a GPU lease measured it faster.",
    )
    seed: int = knob(0, "Random seed (data order, adapter init).")
    cache_dir: str | None = knob(
        None,
        "Tokenized-data cache folder. Default: the project's cache root.",
    )

    def __post_init__(self) -> None:
        parts_from_mappings(self)
        for name in (
            "micro_batch_size",
            "gradient_accumulation_steps",
            "gpus",
            "max_length",
            "eval_samples",
            "keep_checkpoints",
        ):
            require_int(name, getattr(self, name), 1)
        for name in ("eval_interval", "checkpoint_interval", "early_stopping_patience"):
            require_int(name, getattr(self, name), 0)
        for name in ("eval_max_length", "stop_after_steps", "max_steps"):
            require_int(name, getattr(self, name), 1, optional=True)
        require_int("dataloader_workers", self.dataloader_workers, 0, optional=True)
        require(
            self.checkpoint_minutes >= 0,
            f"checkpoint_minutes must be >= 0, but got {self.checkpoint_minutes=}",
        )
        require(self.epochs > 0, f"epochs must be > 0, but got {self.epochs=}")
        require(
            self.max_grad_norm >= 0, f"max_grad_norm must be >= 0, but got {self.max_grad_norm=}"
        )
        require(
            self.early_stopping_min_delta >= 0,
            f"early_stopping_min_delta must be >= 0, but got {self.early_stopping_min_delta=}",
        )
        require(
            0.0 < self.learning_rate < 1.0,
            f"learning_rate must be in (0, 1), but got {self.learning_rate=}",
        )
        require(self.weight_decay >= 0, f"weight_decay must be >= 0, but got {self.weight_decay=}")
        require(
            0.0 <= self.warmup_ratio < 1.0,
            f"warmup_ratio must be in [0, 1), but got {self.warmup_ratio=}",
        )
        require(
            0.0 < self.validation_fraction < 1.0,
            f"validation_fraction must be in (0, 1), but got {self.validation_fraction=}",
        )
        require_choice("scheduler", self.scheduler, SCHEDULERS)
        require_choice("precision", self.precision, PRECISIONS)
        require_choice("device", self.device, DEVICES)
        require_choice("overflow", self.overflow, OVERFLOW_MODES)
        require_choice("packing", self.packing, PACKING_MODES)
        require_choice("quantization", self.quantization, QUANTIZATION_MODES)
        require_choice("liger", self.liger, LEVER_MODES)
        require_choice("sdpa_fast_path", self.sdpa_fast_path, LEVER_MODES)
        require(
            self.packing == "none" or self.overflow == "truncate",
            f"packing={self.packing!r} keeps samples apart, but overflow={self.overflow!r} "
            "joins them into blocks: use overflow=truncate",
        )

    def data_spec(self) -> DataSpec:
        """How this run reads and tokenizes its data."""
        from trainers.data.dataset import DataSpec

        # Every field of DataSpec but its path is the TrainSpec field of the same name.
        names = [f.name for f in dataclasses.fields(DataSpec) if f.name != "path"]
        return DataSpec(path=self.data, **{name: getattr(self, name) for name in names})

    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer step, over all the run's processes."""
        return self.micro_batch_size * self.gradient_accumulation_steps * self.gpus

    @property
    def checkpointing(self) -> bool:
        """Whether the run saves checkpoints (by steps or by minutes)."""
        return self.checkpoint_interval > 0 or self.checkpoint_minutes > 0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["lora"]["target_modules"] = (
            self.lora.target_modules
            if isinstance(self.lora.target_modules, str)
            else list(self.lora.target_modules)
        )
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainSpec:
        """Build from a plain mapping (YAML, JSON); unknown keys are an error."""
        return from_mapping(cls, values, "training")


class Schedule(Protocol):
    """What fixes a run's step count: a `TrainSpec`, or the time model's `Plan`."""

    @property
    def micro_batch_size(self) -> int: ...

    @property
    def gradient_accumulation_steps(self) -> int: ...

    @property
    def epochs(self) -> float: ...

    @property
    def gpus(self) -> int: ...

    @property
    def max_steps(self) -> int | None: ...


EVAL_BATCH_FACTOR = 2


def eval_batch_size(micro_batch_size: int) -> int:
    """Samples per evaluation forward pass: more than training's, as nothing is kept for a
    backward pass (the output logits, which often dominate, are the same per token: hence
    only twice). The trainer halves it after an out-of-memory error."""
    return EVAL_BATCH_FACTOR * micro_batch_size


def optimizer_steps(run: Schedule, train_samples: int) -> int:
    """Optimizer steps of a run's schedule, counted the way transformers' Trainer counts them.

    Each epoch is ceil(train_samples / micro_batch_size) micro-batches, grouped by
    gradient_accumulation_steps into optimizer steps (a short last group still makes a
    step); on N processes each takes ceil(train_samples / (N x micro_batch_size)) of them
    (accelerate's sharded sampler repeats samples to even the last ones out). `max_steps`,
    when set, replaces the count. A `stop_after_steps` cut is not part
    of the schedule and is not counted.

    Args:
        run: The run's batch sizes, epochs and max_steps.
        train_samples: Training samples (after the validation split).
    """
    if run.max_steps is not None:
        return run.max_steps
    micro_batches = math.ceil(train_samples / (run.micro_batch_size * run.gpus))
    per_epoch = max(1, math.ceil(micro_batches / run.gradient_accumulation_steps))
    return max(1, math.ceil(per_epoch * run.epochs))


class PackedSchedule(Schedule, Protocol):
    """A schedule whose micro-batches may be packed sequences: a `TrainSpec`, a `Plan`."""

    @property
    def packing(self) -> str: ...

    @property
    def max_length(self) -> int: ...


def training_items(run: PackedSchedule, train_lengths: Sequence[int]) -> int:
    """Micro-batch slots of one epoch: the samples, or the packed sequences made of them.

    Args:
        run: The run (its `packing` and `max_length`).
        train_lengths: Token lengths of the training samples at `run.max_length`.
    """
    if run.packing == "padding_free":
        from trainers.data.packing import pack_lengths

        return len(pack_lengths([min(n, run.max_length) for n in train_lengths], run.max_length))
    return len(train_lengths)


def full_run_steps(run: PackedSchedule, train_lengths: Sequence[int]) -> int:
    """Optimizer steps of `run`'s schedule, over packed sequences where it packs."""
    return optimizer_steps(run, training_items(run, train_lengths))
