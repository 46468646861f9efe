"""The checks every config class runs in `__post_init__`: one `require`, and the helpers
that name the field and the bad value the same way everywhere (`common.config` builds the
classes)."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

from common.errors import BadInputError


def require(condition: bool, message: str) -> None:
    """Raise `BadInputError(message)` unless `condition` holds: the check of every config field."""
    if not condition:
        raise BadInputError(message)


def require_int(name: str, value: Any, low: int, *, optional: bool = False) -> None:
    """`value` is an integer (not a bool) >= `low`; None passes when `optional`."""
    require(
        (optional and value is None)
        or (isinstance(value, int) and not isinstance(value, bool) and value >= low),
        f"{name} must be an integer >= {low}, but got {name}={value!r}",
    )


def require_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    """`value` is one of `allowed`."""
    require(
        value in allowed, f"{name} must be one of {', '.join(allowed)}, but got {name}={value!r}"
    )


_BOUNDS: dict[str, tuple[Callable[[Any, Any], bool], str]] = {
    "above": (operator.gt, ">"),
    "at_least": (operator.ge, ">="),
    "below": (operator.lt, "<"),
    "at_most": (operator.le, "<="),
}


def bound_violated(field: dataclasses.Field[Any], value: Any) -> str | None:
    """``must be > 0`` when `value` breaks a bound of `field` (None is not checked), else None."""
    for name, (holds, sign) in _BOUNDS.items():
        bound = field.metadata.get(name)
        if bound is not None and value is not None and not holds(value, bound):
            return f"must be {sign} {bound:g}"
    return None


def check_bounds(config: Any, where: str = "") -> None:
    """Every field of `config` within the bounds its metadata states (`knob`)."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        problem = bound_violated(field, value)
        require(problem is None, f"{where}{field.name} {problem}, but got {field.name}={value!r}")
