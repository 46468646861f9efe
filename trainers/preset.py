"""The preset file: the hand-over from a study to the full training run.

YAML with a `version` and the sections `model`, `lora`, `data`, `training`, `estimate`
and `provenance`. `hpo.export` writes it; `trainers.train --preset` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import BadInputError
from common.files import read_yaml
from trainers.spec import TrainSpec

PRESET_VERSION = 1
_DATA_FIELDS = (
    "max_length",
    "eval_max_length",
    "overflow",
    "skip_bad_lines",
    "validation_fraction",
)
_NOT_TRAINING = {"model", "data", "lora", "output_dir", "cache_dir", *_DATA_FIELDS}


@dataclass
class Preset:
    spec: TrainSpec
    estimate: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)


def preset_dict(
    spec: TrainSpec, *, estimate: dict[str, Any], provenance: dict[str, Any]
) -> dict[str, Any]:
    """The preset content for `spec` (plain types, ready for `yaml.safe_dump`)."""
    values = spec.to_dict()
    return {
        "version": PRESET_VERSION,
        "model": {"path": spec.model},
        "lora": values["lora"],
        "data": {"path": spec.data, **{k: values[k] for k in _DATA_FIELDS}},
        "training": {k: v for k, v in values.items() if k not in _NOT_TRAINING},
        "estimate": estimate,
        "provenance": provenance,
    }


def load_preset(path: str | Path, **overrides: Any) -> Preset:
    """Read and validate a preset; `overrides` replace training fields (command line)."""
    raw = read_yaml(path)
    version = raw.get("version")
    if version != PRESET_VERSION:
        raise BadInputError(f"{path}: unsupported preset version {version!r} (expected 1)")
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
    )
