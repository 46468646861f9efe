"""TrainSpec validation: every bad value names its field."""

from __future__ import annotations

import pytest

from common.errors import BadInputError
from trainers.spec import LoraSpec, TrainSpec


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("micro_batch_size", 0),
        ("gradient_accumulation_steps", -1),
        ("learning_rate", 0.0),
        ("learning_rate", 2.0),
        ("max_length", 0),
        ("max_steps", 0),
        ("epochs", 0),
        ("scheduler", "exotic"),
        ("precision", "fp8"),
        ("device", "tpu"),
        ("overflow", "wrap"),
        ("eval_interval", -5),
        ("warmup_ratio", 1.5),
        ("validation_fraction", 1.0),
    ],
)
def test_bad_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(BadInputError, match=field):
        TrainSpec(model="m", data="d", **{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"), [("r", 0), ("alpha", 0), ("dropout", 1.0), ("target_modules", [])]
)
def test_bad_lora_values(field: str, value: object) -> None:
    with pytest.raises(BadInputError, match=field):
        LoraSpec(**{field: value})  # type: ignore[arg-type]


def test_from_dict_rejects_unknown_and_missing() -> None:
    with pytest.raises(BadInputError, match="unknown training field"):
        TrainSpec.from_dict({"model": "m", "data": "d", "micro_batch": 4})
    with pytest.raises(BadInputError, match="missing training field"):
        TrainSpec.from_dict({"model": "m"})
    spec = TrainSpec.from_dict(
        {"model": "m", "data": "d", "lora": {"r": 4, "target_modules": ["q_proj"]}}
    )
    assert spec.lora.r == 4 and spec.lora.target_modules == ("q_proj",)
    assert TrainSpec.from_dict(spec.to_dict()) == spec
