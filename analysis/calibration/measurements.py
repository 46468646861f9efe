"""What one real training run measured, as the calibration fits and stores it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.timemodel.workload import LEVER_STEP_FACTOR, NF4_STEP_FACTOR
from common.errors import BadInputError
from trainers.spec import QUANTIZATION_MODES, eval_batch_size

WARMUP_MICRO_STEPS = 3
MAX_STORED_MICRO_STEPS = 200


@dataclass(frozen=True)
class RunMeasurements:
    """What one real training run measured (the trainer's result JSON).

    Attributes:
        micro_step_seconds: Wall time of each micro-step (forward + backward).
        micro_step_tokens: Padded tokens of each micro-batch.
        micro_step_seq_len: Padded length of each micro-batch.
        micro_batch_size: Configured samples per micro-batch.
        optimizer_step_seconds: Wall time of each optimizer step.
        eval_seconds: Wall time of each evaluation.
        eval_tokens: Tokens evaluated in each evaluation.
        checkpoint_seconds: Wall time of each checkpoint save.
        startup_seconds: Process start to first step.
        peak_memory_bytes: Peak memory of the run (0 = not measured).
        peak_reserved_bytes: CUDA: the allocator's reserved peak (0 = not measured: CPU, MPS,
            or a run recorded before it was).
        lora_r: LoRA rank.
        trainable_parameters: Trainable parameters of the run.
        gradient_checkpointing: Whether activations were recomputed.
        max_length: Truncation length.
        warmup_steps: Leading micro-steps that are warm-up: they calibrate the warm-up cost,
            not the step rates; when > 0 the first optimizer step is warm-up too.
        loop_seconds: Training time outside the timed micro- and optimizer steps (fetching
            and collating batches, the loop's bookkeeping), over the whole run.
        loop_micro_steps: Micro-steps of the whole run that `loop_seconds` covers.
        eval_samples: Samples per evaluation (0 = unknown).
        quantization: The base's weights: "none", or "nf4" (QLoRA). An NF4 run's steps are
            slower and its weights smaller: the fit takes both out, so that one set of
            coefficients serves both kinds of run (`analysis.timemodel.workload.NF4_STEP_FACTOR`).
        micro_step_new_shape: True where the micro-batch's padded length had not been seen
            earlier in the run. On a GPU such a step pays one-off costs (the allocator's new
            blocks, cuBLAS and attention kernel choices): 0.25-2 s against 0.1 s on an H100
            (`docs/measurements/`). Empty: derived from `micro_step_seq_len` (exact before
            `capped`, which keeps the flags it was given).
    """

    micro_step_seconds: tuple[float, ...]
    micro_step_tokens: tuple[int, ...]
    micro_step_seq_len: tuple[int, ...]
    micro_batch_size: int
    optimizer_step_seconds: tuple[float, ...]
    eval_seconds: tuple[float, ...]
    eval_tokens: tuple[int, ...]
    checkpoint_seconds: tuple[float, ...]
    startup_seconds: float
    peak_memory_bytes: int
    lora_r: int
    trainable_parameters: int
    gradient_checkpointing: bool
    max_length: int
    warmup_steps: int = WARMUP_MICRO_STEPS
    loop_seconds: float = 0.0
    loop_micro_steps: int = 0
    eval_samples: int = 0
    quantization: str = "none"
    micro_step_new_shape: tuple[bool, ...] = ()
    levers: tuple[str, ...] = ()  # speed levers the run used (trainers.model.levers)
    peak_reserved_bytes: int = 0

    def __post_init__(self) -> None:
        n = len(self.micro_step_seconds)
        if not self.micro_step_new_shape:
            object.__setattr__(self, "micro_step_new_shape", first_seen(self.micro_step_seq_len))
        if len(self.micro_step_new_shape) != n:
            raise BadInputError(
                f"micro_step_new_shape must have one flag per micro-step ({n}) but got "
                f"{len(self.micro_step_new_shape)}"
            )
        if len(self.micro_step_tokens) != n or len(self.micro_step_seq_len) != n:
            raise BadInputError(
                "micro_step_seconds, micro_step_tokens and micro_step_seq_len must have the "
                f"same length but got {n}, {len(self.micro_step_tokens)}, "
                f"{len(self.micro_step_seq_len)}"
            )
        if len(self.eval_seconds) != len(self.eval_tokens):
            raise BadInputError("eval_seconds and eval_tokens must have the same length")
        if self.quantization not in QUANTIZATION_MODES:
            raise BadInputError(
                f"quantization must be one of {QUANTIZATION_MODES} but got "
                f"quantization={self.quantization!r}"
            )
        if self.micro_batch_size < 1 or self.trainable_parameters < 1:
            raise BadInputError(
                "micro_batch_size and trainable_parameters must be >= 1 but got "
                f"{self.micro_batch_size=}, {self.trainable_parameters=}"
            )

    @classmethod
    def from_result_dict(cls, data: Mapping[str, Any]) -> RunMeasurements:
        """Read a trainer result dict; config keys may sit at the top or under "config"."""
        config = data.get("config") or {}

        def get(key: str, default: Any = None) -> Any:
            if key in data:
                return data[key]
            if key in config:
                return config[key]
            if default is not None:
                return default
            raise BadInputError(f"run measurements lack the field {key!r}")

        try:
            evals = list(get("eval_records", []))
            micro = tuple(float(x) for x in get("micro_step_seconds"))
            optimizer = tuple(float(x) for x in get("optimizer_step_seconds", []))
            loop, loop_steps = _loop_time(data, micro, optimizer)
            return cls(
                micro_step_seconds=micro,
                micro_step_tokens=tuple(int(x) for x in get("micro_step_tokens")),
                micro_step_seq_len=tuple(int(x) for x in get("micro_step_seq_len")),
                micro_batch_size=int(get("micro_batch_size")),
                optimizer_step_seconds=optimizer,
                eval_seconds=tuple(float(e["seconds"]) for e in evals),
                eval_tokens=tuple(int(e["tokens"]) for e in evals),
                checkpoint_seconds=tuple(float(x) for x in get("checkpoint_seconds", [])),
                # A trial on a base model kept from an earlier trial did not load it: its
                # start-up says nothing of a full run's (0: not fitted).
                startup_seconds=0.0
                if data.get("reused_base_model")
                else float(get("startup_seconds", 0.0)),
                peak_memory_bytes=int(get("peak_memory_bytes", 0)),
                lora_r=int(get("lora_r")),
                trainable_parameters=int(get("trainable_parameters")),
                gradient_checkpointing=bool(get("gradient_checkpointing", False)),
                max_length=int(get("max_length")),
                warmup_steps=int(data.get("warmup_steps", WARMUP_MICRO_STEPS)),
                loop_seconds=loop,
                loop_micro_steps=loop_steps,
                eval_samples=_eval_samples(data, config, evals),
                quantization=str(get("quantization", "none")),
                micro_step_new_shape=tuple(bool(x) for x in data.get("micro_step_new_shape", ())),
                levers=tuple(str(x) for x in data.get("levers", ())),
                peak_reserved_bytes=int(data.get("peak_reserved_bytes") or 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, BadInputError):
                raise
            raise BadInputError(f"malformed run measurements: {exc!r}") from exc

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict that `from_result_dict` reads back."""
        # Shallow: every field is a number, a string or a tuple of them (asdict's deep copy
        # of the step tuples cost a calibration's refit more than some of its fits).
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["eval_records"] = [
            {"seconds": s, "tokens": t}
            for s, t in zip(self.eval_seconds, self.eval_tokens, strict=True)
        ]
        del data["eval_seconds"], data["eval_tokens"]
        return data

    @property
    def step_factor(self) -> float:
        """How much slower this run's micro-steps are than the same run's unquantized and
        without speed levers (`analysis.timemodel.workload`)."""
        factor = NF4_STEP_FACTOR if self.quantization == "nf4" else 1.0
        for lever in self.levers:
            factor *= LEVER_STEP_FACTOR[lever]
        return factor

    @property
    def optimizer_warmup_steps(self) -> int:
        """Leading optimizer steps that are warm-up: the first one allocates AdamW's state."""
        return 1 if self.warmup_steps and self.optimizer_step_seconds else 0

    @property
    def eval_batches(self) -> int:
        """Forward calls per evaluation (`trainers.spec.eval_batch_size` samples each)."""
        return math.ceil(self.eval_samples / eval_batch_size(self.micro_batch_size))

    def capped(self, max_micro_steps: int = MAX_STORED_MICRO_STEPS) -> RunMeasurements:
        """Keep the warm-up steps and at most `max_micro_steps` evenly spaced steady ones.

        Even spacing keeps stalls in proportion, so the spread fitted later is unchanged.
        Capping twice changes nothing.
        """
        w = min(self.warmup_steps, len(self.micro_step_seconds))
        keep = [
            *range(w),
            *(w + i for i in _even(len(self.micro_step_seconds) - w, max_micro_steps)),
        ]
        o = self.optimizer_warmup_steps
        opt_keep = [
            *range(o),
            *(o + i for i in _even(len(self.optimizer_step_seconds) - o, max_micro_steps)),
        ]
        return dataclasses.replace(
            self,
            micro_step_seconds=tuple(self.micro_step_seconds[i] for i in keep),
            micro_step_tokens=tuple(self.micro_step_tokens[i] for i in keep),
            micro_step_seq_len=tuple(self.micro_step_seq_len[i] for i in keep),
            micro_step_new_shape=tuple(self.micro_step_new_shape[i] for i in keep),
            optimizer_step_seconds=tuple(self.optimizer_step_seconds[i] for i in opt_keep),
        )


def first_seen(seq_lens: Sequence[int]) -> tuple[bool, ...]:
    """True at each micro-step whose padded length no earlier micro-step had."""
    seen: set[int] = set()
    flags = []
    for length in seq_lens:
        flags.append(length not in seen)
        seen.add(length)
    return tuple(flags)


def _loop_time(
    data: Mapping[str, Any], micro: Sequence[float], optimizer: Sequence[float]
) -> tuple[float, int]:
    """Loop time outside the timed steps: stored as such, or derived from the trainer's timings."""
    if "loop_seconds" in data:
        return float(data["loop_seconds"]), int(data.get("loop_micro_steps", 0))
    timings = data.get("timings") or {}
    if "train" in timings and micro:
        return float(timings["train"]) - sum(micro) - sum(optimizer), len(micro)
    return 0.0, 0


def _eval_samples(
    data: Mapping[str, Any], config: Mapping[str, Any], evals: Sequence[Mapping[str, Any]]
) -> int:
    """Samples per evaluation: recorded, or estimated from the tokens and the mean length."""
    for source in (data, config):
        if source.get("eval_samples"):
            return int(source["eval_samples"])
    mean = float((data.get("dataset") or {}).get("tokens_mean") or 0.0)
    if evals and mean > 0:
        return max(1, round(float(evals[0]["tokens"]) / mean))
    return 0


def _even(n: int, limit: int) -> list[int]:
    if n <= 0:
        return []
    if n <= limit:
        return list(range(n))
    return sorted({int(round(x)) for x in np.linspace(0, n - 1, limit)})
