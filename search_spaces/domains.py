"""Domains of a search space and their YAML vocabulary (Syne Tune's names, written as data).

A domain is a small frozen value object. In YAML each is a one-key mapping::

    learning_rate: {loguniform: [5.0e-5, 5.0e-3]}
    lora_dropout: {uniform: [0.0, 0.1]}
    lora_r: {int: {low: 4, high: 64, step: 4, log: false}}   # or {int: [4, 64]}
    lora_alpha_ratio: {choice: [1, 2, 4]}
    weight_decay: 0.0                                        # a plain value: fixed

PyYAML reads YAML 1.1, where ``1e-5`` (no dot) is a *string*; numeric strings are
therefore accepted wherever a number is expected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from common.errors import BadInputError

if TYPE_CHECKING:
    import optuna

ChoiceValue: TypeAlias = None | bool | int | float | str


@dataclass(frozen=True)
class Uniform:
    """A float drawn uniformly from ``[low, high]``."""

    low: float
    high: float


@dataclass(frozen=True)
class LogUniform:
    """A float whose logarithm is uniform on ``[log(low), log(high)]``; needs ``0 < low``."""

    low: float
    high: float


@dataclass(frozen=True)
class IntRange:
    """An integer from ``low`` to ``high`` inclusive, on a grid of ``step`` or log-scaled."""

    low: int
    high: int
    step: int = 1
    log: bool = False


@dataclass(frozen=True)
class Choice:
    """One of a fixed list of values (a categorical; one value means a fixed setting)."""

    values: tuple[ChoiceValue, ...]


Domain: TypeAlias = Uniform | LogUniform | IntRange | Choice

KINDS = ("loguniform", "uniform", "int", "choice")


def parse_domain(entry: str, raw: Any) -> Domain:
    """Builds a domain from its YAML form, checking its bounds.

    Args:
        entry: The entry's name, used in error messages (``learning_rate``).
        raw: The value ``yaml.safe_load`` gave for the entry.

    Returns:
        The domain; a plain scalar becomes a one-value :class:`Choice`.

    Raises:
        BadInputError: Unknown kind, malformed arguments, empty choice, ``low > high``,
            ``low <= 0`` on a log scale, or a step that does not divide the range.
    """
    if raw is None or isinstance(raw, (bool, int, float, str)):
        return Choice((raw,))
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise BadInputError(
            f"{entry}: expected a value or a one-key mapping such as {{choice: [...]}}, "
            f"but got {raw!r}"
        )
    ((kind, args),) = raw.items()
    if kind in ("uniform", "loguniform"):
        low, high = _pair(entry, kind, args)
        if low > high or (kind == "loguniform" and low <= 0):
            need = "0 < low <= high" if kind == "loguniform" else "low <= high"
            raise BadInputError(f"{entry}: {kind} needs {need}, but got {low=}, {high=}")
        return LogUniform(low, high) if kind == "loguniform" else Uniform(low, high)
    if kind == "int":
        return _parse_int_range(entry, args)
    if kind == "choice":
        return _parse_choice(entry, args)
    raise BadInputError(f"{entry}: unknown domain kind {kind!r}; known kinds: {', '.join(KINDS)}")


def as_number(entry: str, value: Any) -> float | int:
    """Returns ``value`` as an int or float, accepting numeric strings such as ``'1e-5'``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number: float | int = value
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise BadInputError(f"{entry}: expected a number, but got {value!r}") from None
    else:
        raise BadInputError(f"{entry}: expected a number, but got {value!r}")
    if not math.isfinite(number):
        raise BadInputError(f"{entry}: expected a finite number, but got {value!r}")
    return number


def domain_values(domain: Domain) -> tuple[Any, ...]:
    """The values that bound a domain: ``(low, high)`` or every choice."""
    if isinstance(domain, Choice):
        return domain.values
    return (domain.low, domain.high)


def suggest(trial: optuna.Trial, name: str, domain: Domain) -> Any:
    """Asks ``trial`` for a value of ``name`` drawn from ``domain``."""
    if isinstance(domain, LogUniform):
        return trial.suggest_float(name, domain.low, domain.high, log=True)
    if isinstance(domain, Uniform):
        return trial.suggest_float(name, domain.low, domain.high)
    if isinstance(domain, IntRange):
        return trial.suggest_int(name, domain.low, domain.high, step=domain.step, log=domain.log)
    return trial.suggest_categorical(name, domain.values)


def _pair(entry: str, kind: str, args: Any) -> tuple[float, float]:
    if not isinstance(args, Sequence) or isinstance(args, str) or len(args) != 2:
        raise BadInputError(f"{entry}: {kind} needs [low, high], but got {args!r}")
    return float(as_number(entry, args[0])), float(as_number(entry, args[1]))


def _whole(entry: str, field: str, value: Any) -> int:
    number = as_number(f"{entry}.{field}", value)
    if number != int(number):
        raise BadInputError(f"{entry}: int {field} must be a whole number, but got {value!r}")
    return int(number)


def _parse_int_range(entry: str, args: Any) -> IntRange:
    if isinstance(args, Mapping):
        unknown = sorted(set(args) - {"low", "high", "step", "log"})
        if unknown or "low" not in args or "high" not in args:
            raise BadInputError(
                f"{entry}: int takes low, high and optional step, log, but got {dict(args)!r}"
            )
        fields = dict(args)
    elif isinstance(args, Sequence) and not isinstance(args, str) and len(args) == 2:
        fields = {"low": args[0], "high": args[1]}
    else:
        raise BadInputError(
            f"{entry}: int needs [low, high] or {{low: .., high: ..}}, got {args!r}"
        )
    low, high = _whole(entry, "low", fields["low"]), _whole(entry, "high", fields["high"])
    step = _whole(entry, "step", fields.get("step", 1))
    log = fields.get("log", False)
    if not isinstance(log, bool):
        raise BadInputError(f"{entry}: int log must be true or false, but got {log!r}")
    if low > high or (log and low <= 0):
        need = "0 < low <= high" if log else "low <= high"
        raise BadInputError(f"{entry}: int needs {need}, but got {low=}, {high=}")
    if step < 1 or (log and step != 1):
        need = "step 1 with log: true" if log else "step >= 1"
        raise BadInputError(f"{entry}: int needs {need}, but got {step=}")
    if (high - low) % step:
        raise BadInputError(f"{entry}: int high - low must be a multiple of step, got {args!r}")
    return IntRange(low, high, step, log)


def _parse_choice(entry: str, args: Any) -> Choice:
    if not isinstance(args, Sequence) or isinstance(args, str) or not args:
        raise BadInputError(f"{entry}: choice needs a non-empty list, but got {args!r}")
    for value in args:
        if not (value is None or isinstance(value, (bool, int, float, str))):
            raise BadInputError(f"{entry}: choice values must be scalars, but got {value!r}")
    if len(set(args)) != len(args):  # Optuna finds a choice by ==: 1, 1.0, True clash
        raise BadInputError(f"{entry}: choice values must be distinct, but got {list(args)!r}")
    return Choice(tuple(args))
