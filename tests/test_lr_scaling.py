"""The learning rate scaled with the effective batch: the space option, sampling, the record."""

from __future__ import annotations

import math

import optuna
import pytest

from common.errors import BadInputError
from search_spaces import load_space, params_from_trial_params, parse_space, sample
from search_spaces.space import DEFAULT_LR_SCALING

SPACE = {
    "profile": {"choice": ["fast", "quality"]},
    "learning_rate": {"loguniform": [1e-4, 1e-3]},
    "lora_r": 8,
    "lora_alpha_ratio": 2,
    "lora_dropout": 0.05,
}


@pytest.mark.parametrize(("scaling", "power"), [("sqrt", 0.5), ("linear", 1.0), ("none", 0.0)])
def test_each_trial_records_its_base_and_its_applied_learning_rate(
    scaling: str, power: float
) -> None:
    space = parse_space(
        {**SPACE, "learning_rate_scaling": scaling, "reference_batch_size": 8},
        profiles=load_space().with_max_length(128).profiles,
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    batches = set()
    for _ in range(12):
        trial = study.ask()
        config = sample(trial, space)
        batch = config["micro_batch_size"] * config["gradient_accumulation_steps"]
        batches.add(batch)
        assert config["base_learning_rate"] == trial.params["learning_rate"]
        assert config["learning_rate"] == pytest.approx(
            config["base_learning_rate"] * (batch / 8) ** power
        )
        assert config["learning_rate_scaling"] == scaling
        # The export rebuilds the same configuration from the stored params.
        assert params_from_trial_params(trial.params, space) == config
        study.tell(trial, 0.0)
    assert len(batches) > 2  # the profiles gave several effective batches


def test_a_larger_batch_trains_with_a_larger_rate_under_sqrt_scaling() -> None:
    space = parse_space({**SPACE, "learning_rate_scaling": "sqrt"}, profiles=load_space().profiles)
    assert space.reference_batch_size == 16
    assert space.learning_rate_factor(64) == pytest.approx(2.0)
    assert space.learning_rate_factor(4) == pytest.approx(0.5)
    assert space.learning_rate_factor(16) == 1.0


def test_the_default_space_uses_the_measured_default() -> None:
    space = load_space()
    assert space.learning_rate_scaling == DEFAULT_LR_SCALING
    assert math.isclose(space.learning_rate_factor(space.reference_batch_size), 1.0)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"learning_rate_scaling": "cubic"},
            "learning_rate_scaling: must be one of sqrt, linear, none",
        ),
        ({"reference_batch_size": 0}, "reference_batch_size: must be a whole number >= 1"),
        ({"reference_batch_size": 2.5}, "reference_batch_size: must be a whole number >= 1"),
    ],
)
def test_bad_scaling_settings_name_the_key(entry: dict[str, object], message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        parse_space({**SPACE, **entry}, profiles=load_space().profiles)
