"""The preset file: the hand-over from a study to the full training run.

YAML with a `version` and the sections `model`, `lora`, `data`, `training`, `estimate`
and `provenance`. `hpo.export` writes it; `trainers.train --preset` reads it. Its
`training` section is what the full run does, recovery, early stopping and checkpoint
cadence included: `with_full_run_defaults` fills them in when the preset is written and again, from
the same defaults, for a run without a preset.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import BadInputError
from common.files import read_yaml
from trainers.spec import TrainSpec

# Version 1 presets held the trial's recovery, early-stopping and checkpoint settings, not
# the full run's: their full run still gets the full-run defaults over them.
PRESET_VERSION = 2
_READABLE_VERSIONS = (1, PRESET_VERSION)
# Without a checkpoint setting, a full run saves this often: a long run without checkpoints
# cannot be resumed or rolled back.
DEFAULT_CHECKPOINT_MINUTES = 30.0
# Evaluations without improvement before a full run stops early (off for trials: a trial is
# the start of its full run and is judged by the pruner).
DEFAULT_EARLY_STOPPING_PATIENCE = 5
_DATA_FIELDS = (
    "max_length",
    "eval_max_length",
    "overflow",
    "skip_bad_lines",
    "validation_fraction",
    "validation_split",
    "data_columns",
)
_NOT_TRAINING = {"model", "data", "lora", "output_dir", "cache_dir", *_DATA_FIELDS}


@dataclass
class Preset:
    """A preset as read back.

    Attributes:
        spec: The run it describes, with the command line's values over the file's.
        estimate: The study's estimate of the full run.
        provenance: Which study and trial it comes from.
        stated: The `training` values the file states as its full run's own (empty for a
            version 1 preset, whose values were the trial's): they count as given.
    """

    spec: TrainSpec
    estimate: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    stated: dict[str, Any] = field(default_factory=dict)

    def given_with(self, flags: Mapping[str, Any]) -> dict[str, Any]:
        """What the user stated for the run: the preset's stated values, `flags` over them."""
        recovery = {**_mapping(self.stated.get("recovery")), **_mapping(flags.get("recovery"))}
        return {**self.stated, **flags, "recovery": recovery}


def with_full_run_defaults(spec: TrainSpec, given: Mapping[str, Any]) -> TrainSpec:
    """A full run's defaults over `spec`: checkpoints, recovery and early stopping on.

    The one place these defaults are decided: `preset_dict` writes them into a preset and
    `trainers.train` runs with them.

    Args:
        spec: The run.
        given: Values the user stated (flags, a preset's `training`), nested like
            `TrainSpec.to_dict`: a stated `recovery.enabled` or `early_stopping_patience`
            is kept, 0 included.
    """
    changes: dict[str, Any] = {}
    if not spec.checkpointing:
        changes["checkpoint_minutes"] = DEFAULT_CHECKPOINT_MINUTES
    if "enabled" not in _mapping(given.get("recovery")):
        changes["recovery"] = dataclasses.replace(spec.recovery, enabled=True)
    if "early_stopping_patience" not in given and spec.early_stopping_patience == 0:
        changes["early_stopping_patience"] = DEFAULT_EARLY_STOPPING_PATIENCE
    return dataclasses.replace(spec, **changes)


def on_gpus(spec: TrainSpec, preset_gpus: int, given: Mapping[str, Any]) -> TrainSpec:
    """A preset's run on another GPU count, at the preset's effective batch.

    The preset's batch, learning rate and schedule were chosen together; `--gpus N` over it
    changes where the samples of a step are computed, not how many there are. The
    accumulation is divided (or multiplied) to match, else the micro-batch, with one
    micro-step per step. A batch size the user gave stays as given.

    Args:
        spec: The preset's run with the flags over it (its `gpus` the new count).
        preset_gpus: The GPU count the preset was made for.
        given: The flags the user gave.

    Raises:
        BadInputError: No micro-batch x accumulation on `spec.gpus` GPUs makes the batch.
    """
    gpus = spec.gpus
    if gpus == preset_gpus or "micro_batch_size" in given or "gradient_accumulation_steps" in given:
        return spec
    batch = spec.micro_batch_size * spec.gradient_accumulation_steps * preset_gpus
    micro = spec.micro_batch_size
    if batch % (micro * gpus) == 0:
        return dataclasses.replace(spec, gradient_accumulation_steps=batch // (micro * gpus))
    if batch % gpus == 0 and batch // gpus <= micro:
        return dataclasses.replace(spec, micro_batch_size=batch // gpus, gradient_accumulation_steps=1)
    raise BadInputError(
        f"gpus={gpus} cannot keep the preset's effective batch of {batch} (micro-batch {micro} "
        f"x accumulation {spec.gradient_accumulation_steps} x {preset_gpus} GPU(s)): give "
        "--micro-batch-size and --gradient-accumulation-steps for that count"
    )


# What a run may change over its preset and still be the full run the preset's estimate
# predicted: where it writes and what it keeps, how it recovers or stops early (a run that
# stops is not finished and is compared with nothing), its seed.
_BESIDE_THE_RUN = frozenset({
    "output_dir", "cache_dir", "keep_checkpoints", "dataloader_workers", "recovery",
    "early_stopping_patience", "early_stopping_min_delta", "stop_after_steps", "seed",
})  # fmt: skip
# What changes its duration but not the loss it ends at: where and how each step's samples
# are computed (the effective batch, compared on its own, stays), how often it evaluates
# and saves.
_SPEED_ONLY = frozenset({
    "gpus", "micro_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
    "compile", "liger", "sdpa_fast_path", "device", "precision", "eval_interval",
    "checkpoint_interval", "checkpoint_minutes",
})  # fmt: skip
_PATHS = ("model", "data")
# The MLflow tag of a full run that changed what its loss depends on: its names, comma-separated.
DEPARTS_TAG = "hpo.departs_from_preset"


def departures(preset: TrainSpec, run: TrainSpec) -> dict[str, list[Any]]:
    """The settings `run` changed over its preset's own run, {name: [preset's, run's]}.

    A LoRA setting is named `lora.r`; the effective batch is compared on its own
    (`effective_batch_size`); model and data paths are compared as the files they name.
    What leaves the run the one its estimate predicted (`_BESIDE_THE_RUN`) is left out.
    """
    def flat(spec: TrainSpec) -> dict[str, Any]:
        values = spec.to_dict()
        out = {k: v for k, v in values.items() if k != "lora" and k not in _BESIDE_THE_RUN}
        out.update({f"lora.{k}": v for k, v in values["lora"].items()})
        out["effective_batch_size"] = spec.effective_batch_size
        for name in _PATHS:
            out[name] = str(Path(out[name]).expanduser().resolve())
        return out

    before, after = flat(preset), flat(run)
    return {k: [before[k], after[k]] for k in before if before[k] != after[k]}


def changes_the_loss(departed: Mapping[str, Any] | None) -> list[str]:
    """The departures (`departures`) after which a run does not end at the loss its preset
    predicted: not its configuration's full run (its step times still measure the machine)."""
    return sorted(k for k in departed or {} if k not in _SPEED_ONLY)


def departure_line(departed: Mapping[str, Any]) -> str:
    """One line on what a run changed over its preset, and what is then not compared."""
    changed = ", ".join(
        f"{name} {_shown(values[1])} (the preset's: {_shown(values[0])})"
        for name, values in sorted(departed.items())
    )
    if changes_the_loss(departed):
        return (
            f"not the preset's full run: {changed}; its duration and final loss are not "
            "compared with the preset's estimate, nor reported to its study as the "
            "configuration's (its step times still are)"
        )
    return f"the preset's run, on other settings: {changed}; its duration is not compared"


def _shown(value: Any) -> str:
    return "none" if value is None else str(value)


def launch_command(path: str | Path, *, tracking_uri: str | None = None) -> str:
    """The command that trains the preset at `path`, on however many GPUs it names.

    It is one command for any count: `trainers.train` reads `training.gpus` and, above one,
    starts that many processes itself through torchrun (`trainers.launch`), which also keeps
    a window stop's exit 3 (under a user's own torchrun it reads as a failure).
    `tracking_uri` (give it redacted) reports the run back to a study's store.
    """
    command = f"python -m trainers.train --preset {shlex.quote(str(path))}"
    if tracking_uri:
        command += f" --tracking-uri {shlex.quote(tracking_uri)}"
    return command


def launch_note(gpus: int, device: str = "auto") -> str:
    """What the launch command needs beside it, as a suffix: N visible GPUs (or, with
    `device` cpu, that it runs N CPU processes); empty for one."""
    if gpus <= 1:
        return ""
    if device == "cpu":
        return f" on {gpus} CPU processes (gloo, started through torchrun)"
    return (
        f" on {gpus} GPUs (it starts {gpus} processes through torchrun; CUDA_VISIBLE_DEVICES "
        f"must show {gpus} GPUs)"
    )


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def preset_dict(
    spec: TrainSpec, *, estimate: dict[str, Any], provenance: dict[str, Any]
) -> dict[str, Any]:
    """The preset content for the full run of `spec` (plain types, for `yaml.safe_dump`).

    The `training` section holds what `trainers.train --preset` will run with: `spec` with
    the full-run defaults (`with_full_run_defaults`) where it sets none.
    """
    spec = with_full_run_defaults(spec, {})
    values = spec.to_dict()
    return {
        "version": PRESET_VERSION,
        "model": {"path": spec.model},
        "lora": values["lora"],
        "data": {"path": spec.data, **{k: values[k] for k in _DATA_FIELDS}},
        "training": {k: v for k, v in values.items() if k not in _NOT_TRAINING},
        # `write_preset` fills in the command (it knows the path); here what it needs.
        "launch": {
            "gpus": spec.gpus,
            "runs": "runs" + (launch_note(spec.gpus, spec.device) or " on 1 GPU"),
        },
        "estimate": estimate,
        "provenance": provenance,
    }


def load_preset(path: str | Path, **overrides: Any) -> Preset:
    """Read and validate a preset; `overrides` replace training fields (command line)."""
    raw = read_yaml(path)
    version = raw.get("version")
    if version not in _READABLE_VERSIONS or isinstance(version, bool):
        raise BadInputError(
            f"{path}: unsupported preset version {version!r} "
            f"(expected one of {', '.join(map(str, _READABLE_VERSIONS))})"
        )
    for section in ("model", "lora", "data", "training"):
        if not isinstance(raw.get(section), dict):
            raise BadInputError(f"{path}: missing or malformed section '{section}'")
    for section, key in (("model", "path"), ("data", "path")):
        if not isinstance(raw[section].get(key), str):
            raise BadInputError(f"{path}: missing '{section}.{key}'")
    values: dict[str, Any] = dict(raw["training"])
    values.update({k: v for k, v in raw["data"].items() if k != "path"})
    values.update(model=raw["model"]["path"], data=raw["data"]["path"], lora=raw["lora"])
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        spec = TrainSpec.from_dict(values)
    except BadInputError as exc:
        raise BadInputError(f"{path}: {exc}") from exc
    return Preset(
        spec=spec,
        estimate=dict(raw.get("estimate") or {}),
        provenance=dict(raw.get("provenance") or {}),
        stated=dict(raw["training"]) if version != 1 else {},
    )
