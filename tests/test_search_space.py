"""The YAML search-space vocabulary, its validation, and conditional profile sampling."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution

from common.errors import BadInputError
from hpo.samplers import make_sampler
from search_spaces import (
    Choice,
    IntRange,
    LogUniform,
    SearchSpace,
    Uniform,
    load_space,
    params_from_trial_params,
    sample,
)
from tests.spaces import SAMPLERS

DROP = object()  # marks a key a case removes
BASE: dict[str, Any] = {
    "profile": {"choice": ["fast", "quality"]},
    "learning_rate": {"loguniform": [1e-5, 1e-2]},
    "lora_r": {"choice": [4, 8]},
    "lora_alpha_ratio": {"choice": [1, 2]},
    "lora_dropout": {"uniform": [0.0, 0.1]},
}
FAST = {
    "micro_batch_size": [8, 16],
    "gradient_accumulation_steps": [1, 2],
    "max_length": 128,
    "gradient_checkpointing": False,
}


def _profiles(**fast_changes: Any) -> dict[str, Any]:
    fast = {**FAST, **fast_changes}
    return {"fast": {key: value for key, value in fast.items() if value is not DROP}}


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*evaluated at point.*")  # skopt repeats
        yield


def _write(tmp_path: Path, data: Any, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
    return path


# (changes to BASE, text every error message must contain besides the file name)
INVALID: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "log low > high": ({"learning_rate": {"loguniform": [1e-2, 1e-5]}}, ("learning_rate", "0.01")),
    "log low <= 0": ({"learning_rate": {"loguniform": [0.0, 1e-2]}}, ("learning_rate", "low=0.0")),
    "uniform low > high": ({"lora_dropout": {"uniform": [0.1, 0.0]}}, ("lora_dropout", "0.1")),
    "uniform one bound": ({"lora_dropout": {"uniform": [0.1]}}, ("lora_dropout", "[0.1]")),
    "bound not a number": ({"lora_dropout": {"uniform": ["a", 1]}}, ("lora_dropout", "'a'")),
    "empty choice": ({"lora_r": {"choice": []}}, ("lora_r", "[]")),
    "duplicate choice": ({"lora_r": {"choice": [8, 8]}}, ("lora_r", "[8, 8]")),
    "unknown kind": ({"lora_dropout": {"normal": [0, 1]}}, ("lora_dropout", "'normal'")),
    "two kinds": ({"lora_r": {"choice": [4], "int": [1, 2]}}, ("lora_r", "choice")),
    "unknown key": ({"batch_size": {"choice": [8]}}, ("batch_size",)),
    "edited lora_targets": (
        {"lora_targets": ["q_proj", "lm_head"]},
        ("lora_targets", "'lm_head'", "delete the line"),
    ),
    "profile-only key": ({"micro_batch_size": {"choice": [8]}}, ("micro_batch_size",)),
    "missing key": ({"lora_r": DROP}, ("missing", "lora_r")),
    "int low > high": ({"lora_r": {"int": {"low": 8, "high": 4}}}, ("lora_r", "low=8")),
    "int unknown field": ({"lora_r": {"int": {"low": 4, "high": 8, "stride": 2}}}, ("stride",)),
    "int bad step": ({"lora_r": {"int": {"low": 4, "high": 9, "step": 2}}}, ("lora_r", "9")),
    "int log low 0": ({"lora_r": {"int": {"low": 0, "high": 8, "log": True}}}, ("lora_r", "low=0")),
    "int log with step": (
        {"lora_r": {"int": {"low": 1, "high": 9, "step": 2, "log": True}}},
        ("lora_r", "step=2"),
    ),
    "int fraction": ({"lora_r": {"int": [1.5, 8]}}, ("lora_r", "1.5")),
    "rank as float range": ({"lora_r": {"uniform": [4, 8]}}, ("lora_r", "uniform")),
    "rank not whole": ({"lora_r": {"choice": [4, 8.5]}}, ("lora_r", "8.5")),
    "rank zero": ({"lora_r": {"int": [0, 8]}}, ("lora_r", "0")),
    "dropout out of range": ({"lora_dropout": {"uniform": [0.0, 1.5]}}, ("lora_dropout", "1.5")),
    "lr not a number": ({"learning_rate": {"choice": ["fast"]}}, ("learning_rate", "'fast'")),
    "nested choice": ({"lora_r": {"choice": [[4, 8]]}}, ("lora_r", "[4, 8]")),
    "unknown profile": ({"profile": {"choice": ["fast", "turbo"]}}, ("profile", "'turbo'")),
    "profile as range": ({"profile": {"uniform": [0, 1]}}, ("profile", "uniform")),
    "profile unknown field": ({"profiles": _profiles(batch=4)}, ("profiles.fast", "batch")),
    "profile missing field": (
        {"profiles": _profiles(gradient_checkpointing=DROP)},
        ("profiles.fast", "gradient_checkpointing"),
    ),
    "profile zero batch": (
        {"profiles": _profiles(micro_batch_size=[0, 8])},
        ("profiles.fast.micro_batch_size", "0"),
    ),
    "profile empty accumulation": (
        {"profiles": _profiles(gradient_accumulation_steps=[])},
        ("profiles.fast.gradient_accumulation_steps", "[]"),
    ),
    "profile bad length": (
        {"profiles": _profiles(max_length=-1)},
        ("profiles.fast.max_length", "-1"),
    ),
    "profile checkpointing not bool": (
        {"profiles": _profiles(gradient_checkpointing="yes")},
        ("profiles.fast.gradient_checkpointing", "'yes'"),
    ),
    "profile bad name": ({"profiles": {"fa st": FAST}}, ("profiles", "'fa st'")),
    "no profiles": ({"profiles": {}}, ("profiles", "{}")),
    "packing not a mode": (
        {"packing": {"choice": ["none", "packed"]}},
        ("packing", "none, padding_free", "'packed'"),
    ),
    "quantization not a mode": ({"quantization": "int8"}, ("quantization", "nf4", "'int8'")),
    "packing a range": ({"packing": {"uniform": [0, 1]}}, ("packing", "none, padding_free")),
    "space names a profile the section lacks": (
        {"profiles": _profiles()},
        ("profile", "'quality'"),
    ),
}


@pytest.mark.parametrize("changes, expected", INVALID.values(), ids=INVALID.keys())
def test_invalid_entry_names_the_entry(
    tmp_path: Path, changes: dict[str, Any], expected: tuple[str, ...]
) -> None:
    data = {key: value for key, value in {**BASE, **changes}.items() if value is not DROP}
    path = _write(tmp_path, data)
    with pytest.raises(BadInputError) as caught:
        load_space(path)
    message = str(caught.value)
    assert "\n" not in message
    for text in (str(path), *expected):
        assert text in message


@pytest.mark.parametrize(
    "text, expected",
    [
        ("learning_rate: {loguniform: [1, 2]\n", "not valid YAML"),
        ("- just\n- a list\n", "mapping"),
        ("", "mapping"),
    ],
    ids=["bad yaml", "list", "empty"],
)
def test_unreadable_space_file(tmp_path: Path, text: str, expected: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(BadInputError, match=expected) as caught:
        load_space(path)
    assert str(path) in str(caught.value)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="nope.yaml"):
        load_space(tmp_path / "nope.yaml")


def test_profiles_path_errors_name_that_file(tmp_path: Path) -> None:
    space = _write(tmp_path, {key: v for key, v in BASE.items() if key != "profile"})
    bad = _write(tmp_path, {"profiles": _profiles(max_length=0)}, "profiles.yaml")
    with pytest.raises(BadInputError, match=r"profiles\.yaml: profiles\.fast\.max_length"):
        load_space(space, profiles_path=bad)
    both = _write(tmp_path, {**BASE, "profiles": _profiles()}, "both.yaml")
    with pytest.raises(BadInputError, match="profiles_path"):
        load_space(both, profiles_path=bad)


def test_default_space_loads() -> None:
    space = load_space()
    assert space.profile_names == ("fast", "balanced", "quality", "memory_efficient")
    assert space.domains == {
        "learning_rate": LogUniform(5e-5, 5e-3),
        "lora_r": Choice((4, 8, 16, 32, 64)),
        "lora_alpha_ratio": Choice((1, 2, 4)),
        "lora_dropout": Uniform(0.0, 0.1),
        "packing": Choice(("none", "padding_free")),
        "quantization": Choice(("none", "nf4")),
    }
    memory = space.profiles["memory_efficient"]
    assert memory.gradient_checkpointing and memory.micro_batch_size == (1, 2)
    assert all(profile.description for profile in space.profiles.values())


def test_vocabulary_forms(tmp_path: Path) -> None:
    text = (
        "learning_rate: {loguniform: [1e-5, 1e-2]}\n"  # YAML 1.1 reads 1e-5 as a string
        "lora_r: {int: [4, 64]}\n"
        "lora_alpha_ratio: {int: {low: 1, high: 4, step: 1, log: true}}\n"
        "lora_dropout: 0.05\n"
        "weight_decay: {choice: [0.0, 0.01]}\n"
    )
    space = load_space(_write(tmp_path, text))
    assert space.profile_names == ("fast", "balanced", "quality", "memory_efficient")
    assert space.domains == {
        "learning_rate": LogUniform(1e-5, 1e-2),
        "lora_r": IntRange(4, 64),
        "lora_alpha_ratio": IntRange(1, 4, log=True),
        "lora_dropout": Choice((0.05,)),
        "weight_decay": Choice((0.0, 0.01)),
    }


def test_own_profiles_section_replaces_the_packaged_one(tmp_path: Path) -> None:
    data = {**BASE, "profile": {"choice": ["fast"]}, "profiles": _profiles(micro_batch_size=2)}
    space = load_space(_write(tmp_path, data))
    assert list(space.profiles) == ["fast"] and space.profiles["fast"].micro_batch_size == (2,)


def _objective(space: SearchSpace, configs: list[dict[str, Any]], allowed: list[str] | None):
    def objective(trial: optuna.Trial) -> float:
        config = sample(trial, space, allowed)
        configs.append(config)
        return abs(math.log10(config["learning_rate"]) + 3.5) + config["micro_batch_size"] / 16

    return objective


STUDY_LENGTH = 320  # a study's training length (hpo.prepare: the data's p99)


def test_the_shipped_profiles_take_the_studys_length_and_a_profiles_own_stays(
    tmp_path: Path,
) -> None:
    space = load_space()
    assert all(p.max_length is None for p in space.profiles.values())
    with pytest.raises(ValueError, match="with_max_length"):
        space.profiles["fast"].length()
    resolved = space.with_max_length(STUDY_LENGTH)
    assert {p.length() for p in resolved.profiles.values()} == {STUDY_LENGTH}
    assert all(p.length_from_study for p in resolved.profiles.values())
    own = load_space(_write(tmp_path, {**BASE, "profile": {"choice": ["fast"]},
                                       "profiles": _profiles(max_length=96)}))  # fmt: skip
    assert own.with_max_length(STUDY_LENGTH).profiles["fast"].length() == 96
    assert not own.with_max_length(STUDY_LENGTH).profiles["fast"].length_from_study
    study = optuna.create_study()
    with pytest.raises(ValueError, match="has no max_length of its own"):
        sample(study.ask(), space)


SLOW = {"gp": 12, "skopt": 12}  # a model fit takes 0.3-1 s on 2 busy cores: fewer trials


@pytest.mark.parametrize("name", SAMPLERS)
def test_batch_shape_always_comes_from_the_chosen_profile(name: str) -> None:
    space = load_space().with_max_length(STUDY_LENGTH)
    configs: list[dict[str, Any]] = []
    study = optuna.create_study(sampler=make_sampler(name, seed=3, n_startup_trials=5))
    study.optimize(_objective(space, configs, None), n_trials=SLOW.get(name, 60))
    for config, trial in zip(configs, study.trials, strict=True):
        profile = space.profiles[config["profile"]]
        assert config["micro_batch_size"] in profile.micro_batch_size
        assert config["gradient_accumulation_steps"] in profile.gradient_accumulation_steps
        assert config["max_length"] == profile.length() == STUDY_LENGTH
        assert config["lora_alpha"] == config["lora_alpha_ratio"] * config["lora_r"]
        assert {key.split("@")[1] for key in trial.params if "@" in key} == {profile.name}
        assert params_from_trial_params(trial.params, space) == config
    assert len({config["profile"] for config in configs}) > 1


def test_allowed_profiles_are_respected() -> None:
    space = load_space().with_max_length(STUDY_LENGTH)
    configs: list[dict[str, Any]] = []
    allowed = ["quality", "fast"]
    study = optuna.create_study(sampler=make_sampler("tpe", seed=0))
    study.optimize(_objective(space, configs, allowed), n_trials=30)
    assert {config["profile"] for config in configs} == set(allowed)
    # The choices keep the space's order whatever order the caller gives.
    profile = study.trials[0].distributions["profile"]
    assert isinstance(profile, CategoricalDistribution) and profile.choices == ("fast", "quality")
    with pytest.raises(BadInputError, match="keep one list per study"):
        study.optimize(_objective(space, configs, ["fast"]), n_trials=1, catch=())


@pytest.mark.parametrize("allowed", [[], ["turbo"]], ids=["empty", "unknown"])
def test_bad_allowed_profiles(allowed: list[str]) -> None:
    study = optuna.create_study()
    with pytest.raises(BadInputError, match="allowed_profiles"):
        sample(study.ask(), load_space(), allowed)


def test_params_from_other_space_names_what_is_missing() -> None:
    space = load_space()
    with pytest.raises(BadInputError, match="micro_batch_size@fast"):
        params_from_trial_params({"profile": "fast", "learning_rate": 1e-3}, space)
    with pytest.raises(BadInputError, match="'turbo'"):
        params_from_trial_params({"profile": "turbo"}, space)


def test_word_keys_take_the_trainers_words() -> None:
    from search_spaces.space import WORDS
    from trainers.spec import PACKING_MODES, QUANTIZATION_MODES, TrainSpec

    assert WORDS == {"packing": PACKING_MODES, "quantization": QUANTIZATION_MODES}
    # The first word is what a space without the key trains with: the trainer's default.
    defaults = TrainSpec(model="m", data="d")
    assert (defaults.packing, defaults.quantization) == (WORDS["packing"][0], "none")


def _drawn(space: SearchSpace, n_trials: int = 40) -> tuple[list[dict[str, Any]], optuna.Study]:
    configs: list[dict[str, Any]] = []
    study = optuna.create_study(sampler=make_sampler("random", seed=1))
    study.optimize(_objective(space, configs, None), n_trials=n_trials)
    return configs, study


def test_the_default_space_samples_packing_on_and_off() -> None:
    from search_spaces.space import gate_quantization

    space = gate_quantization(load_space().with_max_length(STUDY_LENGTH), allowed=False)
    configs, study = _drawn(space)
    assert {config["packing"] for config in configs} == {"none", "padding_free"}
    # Not allowed: never proposed, not even as an Optuna parameter; every run full precision.
    assert {config["quantization"] for config in configs} == {"none"}
    assert not any("quantization" in trial.params for trial in study.trials)
    for config, trial in zip(configs, study.trials, strict=True):
        assert params_from_trial_params(trial.params, space) == config


def test_quantization_is_sampled_only_where_allowed() -> None:
    from search_spaces.space import gate_quantization

    space = load_space().with_max_length(STUDY_LENGTH)
    assert gate_quantization(space, allowed=True) is space
    configs, _ = _drawn(gate_quantization(space, allowed=True))
    assert {config["quantization"] for config in configs} == {"none", "nf4"}
    # A space without the key: nothing to gate, and every configuration says "none".
    plain = gate_quantization(space, allowed=False)
    assert gate_quantization(plain, allowed=True) == plain
