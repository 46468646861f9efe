"""A config field's bounds are declared where the reference reads them, and hold.

The generated reference (`scripts/docs_reference.py`) shows a field's bounds from its
metadata (`above`, `at_least`, `below`, `at_most`); the checks in `__post_init__` are what
refuses a value. These tests hold the two together: a declared bound refuses a value past
it, and a field that refuses a far-out value declares a bound on that side.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from common.errors import BadInputError
from hpo.config import Budget, FullRunConfig, StudyConfig, TrackingConfig, TrialConfig
from trainers.run_options import RunTracking, RunWindow
from trainers.spec import LoraSpec, RecoverySpec, TrainSpec

REQUIRED: dict[type, dict[str, Any]] = {TrainSpec: {"model": "m", "data": "d.jsonl"}}
CLASSES = (
    TrainSpec,
    LoraSpec,
    RecoverySpec,
    StudyConfig,
    TrialConfig,
    FullRunConfig,
    Budget,
    TrackingConfig,
    RunWindow,
    RunTracking,
)
LOWER, UPPER = ("above", "at_least"), ("below", "at_most")
# Bounded by another field rather than a number: refused far out, but no bound to declare.
RELATIVE = {
    (RunWindow, "safety_margin_minutes", "upper"): "shorter than the window",
    (Budget, "safety_margin_minutes", "upper"): "shorter than the window",
    (TrialConfig, "promote_fraction", "lower"): "above trial_fraction (read with promote > 0)",
    (StudyConfig, "heartbeat_seconds", "upper"): "shorter than grace_seconds",
}


def _numeric_fields(cls: type) -> list[dataclasses.Field[Any]]:
    out = []
    for field in dataclasses.fields(cls):
        kinds = str(field.type)
        if ("int" in kinds or "float" in kinds) and "bool" not in kinds and "str" not in kinds:
            out.append(field)
    return out


def _whole(field: dataclasses.Field[Any]) -> bool:
    return "int" in str(field.type) and "float" not in str(field.type)


def _build(cls: type, field: dataclasses.Field[Any], value: Any) -> None:
    cls(**{**REQUIRED.get(cls, {}), field.name: value})


def _cases() -> list[tuple[type, dataclasses.Field[Any]]]:
    return [(cls, field) for cls in CLASSES for field in _numeric_fields(cls)]


@pytest.mark.parametrize(
    ("cls", "field"), _cases(), ids=[f"{c.__name__}.{f.name}" for c, f in _cases()]
)
def test_a_declared_bound_refuses_the_value_past_it(
    cls: type, field: dataclasses.Field[Any]
) -> None:
    step = 1 if _whole(field) else 1e-9
    past = {
        "above": lambda b: b,
        "at_least": lambda b: b - step,
        "below": lambda b: b,
        "at_most": lambda b: b + step,
    }
    for name, beyond in past.items():
        if name in field.metadata:
            with pytest.raises(BadInputError):
                _build(cls, field, beyond(field.metadata[name]))


@pytest.mark.parametrize(
    ("cls", "field"), _cases(), ids=[f"{c.__name__}.{f.name}" for c, f in _cases()]
)
def test_a_field_that_refuses_a_far_value_declares_its_bound(
    cls: type, field: dataclasses.Field[Any]
) -> None:
    for side, names, far in (("lower", LOWER, -(10**9)), ("upper", UPPER, 10**9)):
        if any(name in field.metadata for name in names) or (cls, field.name, side) in RELATIVE:
            continue
        value = far if _whole(field) else float(far)
        try:
            _build(cls, field, value)
        except BadInputError as error:
            pytest.fail(f"{cls.__name__}.{field.name} refuses {value} but declares no {side} "
                        f"bound: {error}")  # fmt: skip
