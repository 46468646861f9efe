"""Batch profiles: named bundles of batch shape and memory settings.

A profile fixes what trades throughput against memory together (``micro_batch_size``,
``gradient_accumulation_steps``, ``gradient_checkpointing``), so the search picks one of a
few coherent bundles instead of every combination of them. The search still chooses the
micro-batch and accumulation among the profile's own choices.

A profile's ``max_length`` is optional: without one it trains at the study's length (the
data's p99 token length unless the study sets ``max_length``), so no profile cuts a user's
samples shorter than the data is. A profile that names one cuts every sample there (a
search of shorter training rows, on purpose); the study says how many samples it cuts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common.errors import BadInputError

REQUIRED_FIELDS = (
    "micro_batch_size",
    "gradient_accumulation_steps",
    "gradient_checkpointing",
)
FIELDS = (*REQUIRED_FIELDS, "max_length", "description")
_NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Profile:
    """One named batch profile.

    Attributes:
        name: The profile's name (``fast``).
        micro_batch_size: Sequences per forward/backward pass the search may choose from.
        gradient_accumulation_steps: Micro-batches per optimizer step to choose from.
        max_length: Tokens per sequence after truncation; None: the study's (see
            `SearchSpace.with_max_length`).
        gradient_checkpointing: Whether activations are recomputed to save memory.
        description: One line for people choosing a profile.
    """

    name: str
    micro_batch_size: tuple[int, ...]
    gradient_accumulation_steps: tuple[int, ...]
    max_length: int | None
    gradient_checkpointing: bool
    description: str = ""
    length_from_study: bool = False  # max_length filled in by `SearchSpace.with_max_length`

    def length(self) -> int:
        """The profile's max_length, once the study's is filled in."""
        if self.max_length is None:
            raise ValueError(
                f"profile {self.name!r} has no max_length of its own: resolve the space with "
                "SearchSpace.with_max_length first"
            )
        return self.max_length


def parse_profiles(raw: Any) -> dict[str, Profile]:
    """Builds the profiles from a ``profiles:`` YAML section.

    Args:
        raw: A mapping of profile name to a mapping of its fields.

    Returns:
        The profiles by name, in the section's order.

    Raises:
        BadInputError: Not a non-empty mapping, a bad name, or a profile with an unknown
            field, a missing field or a bad value.
    """
    if not isinstance(raw, Mapping) or not raw:
        raise BadInputError(f"profiles: expected a mapping of profile names, but got {raw!r}")
    return {_name(name): _parse_profile(name, fields) for name, fields in raw.items()}


def _name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise BadInputError(
            f"profiles: a profile name must be letters, digits, '_' or '-', but got {name!r}"
        )
    return name


def _parse_profile(name: str, fields: Any) -> Profile:
    entry = f"profiles.{name}"
    if not isinstance(fields, Mapping):
        raise BadInputError(f"{entry}: expected a mapping of fields, but got {fields!r}")
    unknown = sorted(map(str, set(fields) - set(FIELDS)))
    if unknown:
        raise BadInputError(
            f"{entry}: unknown field(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}"
        )
    missing = [field for field in REQUIRED_FIELDS if field not in fields]
    if missing:
        raise BadInputError(f"{entry}: missing field(s) {', '.join(missing)}")
    checkpointing = fields["gradient_checkpointing"]
    if not isinstance(checkpointing, bool):
        raise BadInputError(
            f"{entry}.gradient_checkpointing: expected true or false, but got {checkpointing!r}"
        )
    description = fields.get("description", "")
    if not isinstance(description, str):
        raise BadInputError(f"{entry}.description: expected text, but got {description!r}")
    return Profile(
        name=name,
        micro_batch_size=_positive_ints(f"{entry}.micro_batch_size", fields["micro_batch_size"]),
        gradient_accumulation_steps=_positive_ints(
            f"{entry}.gradient_accumulation_steps", fields["gradient_accumulation_steps"]
        ),
        max_length=(
            _positive_int(f"{entry}.max_length", fields["max_length"])
            if fields.get("max_length") is not None
            else None
        ),
        gradient_checkpointing=checkpointing,
        description=description.strip(),
    )


def _positive_int(entry: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInputError(f"{entry}: expected a positive integer, but got {value!r}")
    return value


def _positive_ints(entry: str, value: Any) -> tuple[int, ...]:
    """Accepts one positive integer or a non-empty list of distinct ones."""
    if not isinstance(value, Sequence) or isinstance(value, str):
        return (_positive_int(entry, value),)
    values = tuple(_positive_int(entry, item) for item in value)
    if not values or len(set(values)) != len(values):
        raise BadInputError(f"{entry}: expected distinct positive integers, but got {value!r}")
    return values
