"""Config dataclasses from mappings: one `require` and one `from_mapping` for every config class.

A config class is a frozen dataclass whose fields carry ``metadata={"help": ...}`` (and a
default), checked in ``__post_init__`` with `require`. A field whose type is a dataclass is
a *part* of the tree:

- a *section* (the default) is read from a nested mapping under the field's name
  (``budget: {window_hours: 12}``);
- a *flat* part (``metadata={"flat": True, "prefix": "trial_"}``) is read from the enclosing
  mapping's own keys, each ``prefix + name`` unless the field's metadata says ``key``
  (``promote``): a study's YAML keys, stored configs and flags stay flat while the object
  is nested.

`common.flags` generates flags from the same tree, and `to_mapping` writes it back.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from common.checks import require
from common.errors import BadInputError

T = TypeVar("T")


def knob(default: Any, help: str, **metadata: Any) -> Any:
    """A config field in one line: its default, its help and its other metadata.

    Metadata read here: ``above``, ``at_least``, ``below``, ``at_most`` (bounds `check_bounds`
    enforces and `hpo.init` asks within), ``key`` (its name in a flat mapping and its flag),
    ``flag`` (`common.flags`), ``ask`` (`hpo.init`'s question for it).
    """
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


def part(cls: type, help: str | None, **metadata: Any) -> Any:
    """A part of the tree (a dataclass field), built from its class's defaults.

    ``flat=True, prefix="trial_"`` reads it from the enclosing mapping's own keys; without,
    it is a section of its own (`from_mapping`).
    """
    return dataclasses.field(default_factory=cls, metadata={"help": help, **metadata})


def same_as(cls: type, name: str, **change: Any) -> Any:
    """A field declared as `cls`'s field `name` is (help, bounds), its default changed by
    ``default=...``: a knob two configs share is written once."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    default = change.pop("default", field.default)
    return knob(default, **{**field.metadata, **change})


def part_type(cls: type, field: dataclasses.Field[Any]) -> type | None:
    """The dataclass a field of `cls` holds (a part of the tree), else None."""
    return _part_types(cls)[field.name]


@functools.cache
def _part_types(cls: type) -> dict[str, type | None]:
    # Once per class: `get_type_hints` evaluates every annotation string each call, and a
    # config is built per trial and per configuration judged (192 TrainSpecs, 18 s of a
    # study's set-up under load before this cache).
    hints = typing.get_type_hints(cls)
    return {
        name: kind if isinstance(kind, type) and dataclasses.is_dataclass(kind) else None
        for name, kind in hints.items()
    }


def flat_key(part: dataclasses.Field[Any], field: dataclasses.Field[Any]) -> str:
    """The key of a flat part's field in the enclosing mapping (``trial_fraction``)."""
    return str(field.metadata.get("key", part.metadata.get("prefix", "") + field.name))


def flat_fields(
    cls: type,
) -> Iterator[tuple[str, dataclasses.Field[Any] | None, dataclasses.Field[Any]]]:
    """(key, the flat part or None, field) for each key a mapping of `cls` may hold at its top."""
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        part = part_type(cls, field)
        if part is not None and field.metadata.get("flat"):
            for inner in dataclasses.fields(part):  # type: ignore[arg-type]
                yield flat_key(field, inner), field, inner
        else:
            yield field.name, None, field


def _required(field: dataclasses.Field[Any]) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def require_keys(
    cls: type,
    values: Any,
    where: str,
    *,
    every: bool = False,
    ignore_unknown: bool = False,
    renamed: Mapping[str, str] | None = None,
) -> None:
    """A mapping for the dataclass `cls` holds no unknown key and misses none it needs.

    Args:
        cls: The dataclass.
        values: The mapping.
        where: What the mapping is, for messages ("unknown training field(s): micro_batch").
        every: Every field is needed (a record written whole), not only those without defaults.
        ignore_unknown: Skip keys `cls` does not know (a config stored by another version).
        renamed: Keys of earlier versions -> what replaced them, named in the message.

    Raises:
        BadInputError: Not a mapping, an unknown or renamed key, or a missing one.
    """
    require(
        isinstance(values, Mapping), f"{where} must be a mapping, but got {type(values).__name__}"
    )
    keyed = list(flat_fields(cls))
    unknown = sorted(set(values) - {key for key, _, _ in keyed})
    old = [f"{key} (now {renamed[key]})" for key in unknown if renamed and key in renamed]
    require(not old, f"{where} field(s) replaced: {', '.join(old)}")
    require(ignore_unknown or not unknown, f"unknown {where} field(s): {', '.join(unknown)}")
    missing = [key for key, _, f in keyed if key not in values and (every or _required(f))]
    require(not missing, f"missing {where} field(s): {', '.join(missing)}")


def from_mapping(
    cls: type[T],
    values: Any,
    where: str,
    *,
    ignore_unknown: bool = False,
    renamed: Mapping[str, str] | None = None,
) -> T:
    """Build the config dataclass `cls` (parts included) from a plain mapping (YAML, JSON, flags).

    Args:
        cls: The dataclass.
        values: Its values; a section's value may be a mapping or the part itself.
        where: What the mapping is, for messages (``config``, ``budget``, ``training``:
            "unknown training field(s): micro_batch").
        ignore_unknown: Skip keys `cls` does not know (a config stored by another version).
        renamed: Keys of earlier versions -> what replaced them, named in the message.

    Raises:
        BadInputError: Not a mapping, an unknown or renamed key, a missing required field,
            or a value the class refuses.
    """
    require_keys(cls, values, where, ignore_unknown=ignore_unknown, renamed=renamed)
    given: dict[str, Any] = {}
    keyed = list(flat_fields(cls))
    flat: dict[str, dict[str, Any]] = {}
    for key, part, field in keyed:
        if key not in values:
            continue
        if part is not None:
            flat.setdefault(part.name, {})[field.name] = values[key]
            continue
        kind = part_type(cls, field)
        value = values[key]
        if kind is not None and not isinstance(value, kind):
            value = from_mapping(kind, value, field.name, ignore_unknown=ignore_unknown)
        given[field.name] = value
    for name, inner in flat.items():
        kind = part_type(cls, next(f for f in dataclasses.fields(cls) if f.name == name))  # type: ignore[arg-type]
        given[name] = from_mapping(kind, inner, where)  # type: ignore[arg-type]
    try:
        return cls(**given)
    except TypeError as exc:  # a value of a type the dataclass cannot take
        raise BadInputError(f"{where}: {exc}") from exc


def parts_from_mappings(config: Any) -> None:
    """In `__post_init__`: build each section given as a plain mapping (``lora={"r": 4}``)."""
    for field in dataclasses.fields(config):
        kind = part_type(type(config), field)
        value = getattr(config, field.name)
        if kind is not None and isinstance(value, Mapping):
            object.__setattr__(config, field.name, from_mapping(kind, value, field.name))


def to_mapping(config: Any) -> dict[str, Any]:
    """The plain values of a config dataclass, shaped as `from_mapping` reads them."""
    out: dict[str, Any] = {}
    for key, part, field in flat_fields(type(config)):
        owner = getattr(config, part.name) if part is not None else config
        value = getattr(owner, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = to_mapping(value)
        out[key] = value
    return out
