"""A trial, its exported preset and the time model describe the same training.

One real (tiny) study; its trial is exported and read back as a preset, and the preset's
full run is compared field by field with `full_run` of the trial's parameters and with the
plan the time model predicted. Every configured value differs from the defaults and from
the trial's own schedule, so a translation that drops or swaps one fails here. The preset
file's `training` section is what `trainers.train --preset` then runs with.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from analysis.planning.fits import plan_of_spec
from analysis.timemodel.machine import model_profile, this_machine
from analysis.timemodel.model import Plan
from common.cli import run_cli
from hpo.config import StudyConfig, load_config
from hpo.estimator import StudyEstimator
from hpo.export import build_preset, write_preset
from hpo.keys import CONFIG_ATTR
from hpo.prepare import Prepared, prepare
from hpo.runner import run_study
from hpo.trial_runs import full_run, stored_config, trial_runs
from search_spaces.sampling import params_from_trial_params
from trainers.preset import Preset, load_preset, with_full_run_defaults
from trainers.spec import TrainSpec, optimizer_steps

SPACE = """\
profile: {choice: [only]}
learning_rate: 2.0e-3
lora_r: {choice: [4]}
lora_alpha_ratio: 3
lora_dropout: 0.07
weight_decay: 0.01
warmup_ratio: 0.1
profiles:
  only:
    micro_batch_size: [2]
    gradient_accumulation_steps: [3]
    max_length: 96
    gradient_checkpointing: true
"""
# Unlike every default (TrainSpec's and StudyConfig's) and unlike each other.
SETTINGS: dict[str, Any] = {
    "trial_fraction": 0.02,
    "trial_evals": 3,
    "eval_samples": 5,
    "epochs": 0.37,
    "full_eval_interval": 13,
    "full_checkpoint_interval": 29,
    "validation_fraction": 0.15,
    "device": "cpu",
    "precision": "fp32",
    "seed": 5,
}
# What a preset does not carry: the full run picks its own folders.
NOT_IN_PRESET = {"cache_dir"}


@dataclasses.dataclass
class Exported:
    config: StudyConfig
    prepared: Prepared
    trial: optuna.trial.FrozenTrial
    params: dict[str, Any]
    preset: Preset
    stored: dict[str, Any]
    path: Path


@pytest.fixture(scope="module")
def exported(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    work = tmp_path_factory.mktemp("runspec")
    space = work / "space.yaml"
    space.write_text(SPACE)
    config = load_config(
        None,
        {
            "model": str(tiny_model_dir),
            "space": str(space),
            "work_dir": str(work),
            "study_name": "runspec",
            "n_trials": 1,
            "sampler": "random",
            "pruner": "none",
            "rungs": "none",  # one trial, whose preset this is about
            **SETTINGS,
        },
    )
    summary = run_study(config, progress=False)
    assert summary.states["complete"] == 1, summary.states
    study = optuna.load_study(study_name="runspec", storage=config.storage_url)
    trial = study.best_trial
    prepared = prepare(config)
    path = write_preset(
        build_preset(study, trial, storage_url=config.storage_url), work / "preset.yaml"
    )
    return Exported(
        # The study's config as it ran: with its one validation length resolved.
        config=dataclasses.replace(config, eval_max_length=prepared.eval_max_length),
        prepared=prepared,
        trial=trial,
        # What the sampler drew, rebuilt from Optuna's own record (not the user attributes
        # the export reads).
        params=params_from_trial_params(trial.params, prepared.space),
        preset=load_preset(path),
        stored=study.user_attrs[CONFIG_ATTR],
        path=path,
    )


def exported_run(exported: Exported) -> TrainSpec:
    return full_run(
        exported.config,
        exported.params,
        model=exported.prepared.model_path,
        data=exported.prepared.data_path,
    )


def preset_plan(exported: Exported) -> Plan:
    """The time model's plan of the preset's run, on the data the study tokenized."""
    spec, prepared = exported.preset.spec, exported.prepared
    lengths = prepared.dataset_stats[spec.max_length].lengths
    n_train = prepared.train_samples
    return plan_of_spec(
        spec,
        model_profile(spec.model),
        lengths[:n_train],
        n_validation=len(lengths) - n_train,
        hardware=this_machine(spec.device, spec.precision),
    )


@pytest.mark.parametrize(
    "name", [f.name for f in dataclasses.fields(TrainSpec) if f.name not in NOT_IN_PRESET]
)
def test_the_preset_is_the_full_run_of_the_trial(exported: Exported, name: str) -> None:
    # With the full run's recovery, early stopping and checkpoints, as trainers.train runs it.
    expected = with_full_run_defaults(exported_run(exported), {})
    assert getattr(exported.preset.spec, name) == getattr(expected, name)


def test_the_preset_states_what_its_full_run_runs_with(exported: Exported, tmp_path: Path) -> None:
    """Round trip through the real files: the preset file, `trainers.train`, its JSON report."""
    from trainers.train import main

    training = yaml.safe_load(exported.path.read_text())["training"]
    # What a trial had (its pruner judges it; a trial never resumes) is not what the preset says.
    assert training["recovery"]["enabled"] is True
    assert training["early_stopping_patience"] > 0
    assert training["checkpoint_interval"] == SETTINGS["full_checkpoint_interval"]
    report = tmp_path / "run.json"
    argv = ["--preset", str(exported.path), "--max-steps", "2", "--output-dir",
            str(tmp_path / "run"), "--json", str(report), "--quiet"]  # fmt: skip
    assert run_cli(main, argv) == 0
    ran = json.loads(report.read_text())["spec"]
    assert {k: v for k, v in ran.items() if k in training and k != "max_steps"} == {
        k: v for k, v in training.items() if k != "max_steps"
    }
    assert ran["max_steps"] == 2  # the one flag given, over the preset


def test_the_full_run_follows_the_study_config(exported: Exported) -> None:
    spec, config = exported.preset.spec, exported.config
    assert spec.max_steps is None
    assert spec.epochs == config.full_run.epochs
    assert spec.eval_interval == config.full_run.eval_interval
    assert spec.checkpoint_interval == config.full_run.checkpoint_interval
    assert spec.eval_samples == config.eval_samples
    assert (spec.validation_fraction, spec.seed) == (config.validation_fraction, config.seed)
    assert (spec.device, spec.precision) == (config.device, config.precision)
    assert spec.lora.r == 4 and spec.lora.alpha == 12.0 and spec.lora.dropout == 0.07
    assert (spec.micro_batch_size, spec.gradient_accumulation_steps) == (2, 3)
    assert (spec.max_length, spec.gradient_checkpointing) == (96, True)
    assert (spec.learning_rate, spec.weight_decay, spec.warmup_ratio) == (2e-3, 0.01, 0.1)


def test_the_trial_is_the_start_of_the_same_configuration(exported: Exported) -> None:
    config, trial = exported.config, exported.trial
    spec = trial_runs(
        config,
        exported.params,
        model=exported.prepared.model_path,
        data=exported.prepared.data_path,
        train_samples=exported.prepared.train_samples,
    ).trial
    full_steps = trial.user_attrs["full_run_steps"]
    # 2 % of the full run's steps, rounded; evaluations every third of it.
    assert spec.stop_after_steps == round(0.02 * full_steps) >= 3
    assert spec.eval_interval == spec.stop_after_steps // 3
    assert spec.max_steps is None  # the full run's schedule (warm-up, decay horizon), cut short
    assert spec.checkpoint_interval == spec.stop_after_steps  # one save, timed, at its end
    # The trial and its full run evaluate the same samples: their losses are on one scale.
    assert spec.eval_samples == exported.preset.spec.eval_samples == config.eval_samples
    assert dataclasses.replace(
        spec, stop_after_steps=None, eval_interval=0, checkpoint_interval=0, output_dir=""
    ) == dataclasses.replace(
        exported_run(exported), eval_interval=0, checkpoint_interval=0, output_dir=""
    )
    # What the trial trained, as it recorded it.
    assert trial.user_attrs["trained_steps"] == spec.stop_after_steps
    assert trial.user_attrs["trial_fraction"] == config.trial.fraction
    # Every run of the study is scored at one validation length.
    assert spec.eval_max_length == exported.preset.spec.eval_max_length is not None
    assert trial.user_attrs["time_model_run"]["run"]["eval_samples"] == config.eval_samples


def test_the_time_model_plans_the_presets_run(exported: Exported) -> None:
    plan, spec, config = preset_plan(exported), exported.preset.spec, exported.config
    trial = exported.trial
    n_train = exported.prepared.train_samples
    # Counted by hand: micro-batches of 2, groups of 3, 0.37 of an epoch (the Trainer's ceil).
    by_hand = math.ceil(math.ceil(math.ceil(n_train / 2) / 3) * config.full_run.epochs)
    assert optimizer_steps(plan, len(plan.token_lengths)) == by_hand
    assert trial.user_attrs["full_run_steps"] == by_hand
    assert exported.preset.estimate["optimizer_steps"] == by_hand  # the time model's estimate
    assert exported.preset.estimate["full_run_steps"] == by_hand
    assert plan.micro_batch_size == trial.user_attrs["micro_batch_size"] == 2
    assert plan.gradient_accumulation_steps == trial.user_attrs["gradient_accumulation_steps"] == 3
    assert plan.max_length == trial.user_attrs["max_length"] == 96
    assert plan.lora_r == trial.user_attrs["lora_r"] == 4
    assert plan.gradient_checkpointing is trial.user_attrs["gradient_checkpointing"] is True
    assert plan.eval_interval_steps == config.full_run.eval_interval
    assert plan.eval_samples == config.eval_samples
    assert plan.checkpoint_interval_steps == config.full_run.checkpoint_interval
    assert (plan.epochs, plan.max_steps) == (config.full_run.epochs, None)
    assert len(plan.token_lengths) == n_train
    assert (plan.precision, plan.device_kind) == ("fp32", "cpu")
    assert spec.max_length == plan.max_length


def test_the_study_predicted_with_the_same_plan(exported: Exported) -> None:
    estimator = StudyEstimator(
        exported.config,
        exported.prepared,
        hardware=this_machine("cpu", "fp32"),
        model=model_profile(exported.prepared.model_path),
    )
    assert estimator.plan(exported.params, full_run=True) == preset_plan(exported)


def test_the_stored_config_reads_back(exported: Exported) -> None:
    expected = dataclasses.replace(
        exported.config,
        model=None,
        data=None,
        space=None,
        eval_max_length=exported.prepared.eval_max_length,
        max_length=exported.prepared.max_length,  # the study's training length, resolved
    )
    assert stored_config(exported.stored) == dataclasses.replace(expected, storage=None)


# ----------------------------------------------------------- packing and quantization searched

PACKED_PARAMS: dict[str, Any] = {
    "micro_batch_size": 2,
    "gradient_accumulation_steps": 3,
    "max_length": 128,
    "gradient_checkpointing": False,
    "learning_rate": 1e-3,
    "lora_r": 4,
    "lora_alpha": 8,
    "lora_dropout": 0.0,
}


@pytest.fixture(scope="module")
def chat(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A study config and the bundled chat data tokenized the way the trainer does it."""
    from trainers.data.dataset import DataSpec, load_tokenized
    from trainers.data.paths import demo_data_path
    from trainers.model.lora import load_tokenizer

    work = tmp_path_factory.mktemp("packed")
    config = load_config(
        None,
        {"model": str(tiny_model_dir), "data": str(demo_data_path("chat")), "work_dir": str(work),
         "epochs": 2, "trial_fraction": 0.25, "device": "cpu", "precision": "fp32",
         "probe_seconds": 0},
    )  # fmt: skip
    data = load_tokenized(
        DataSpec(
            path=str(config.data),
            max_length=PACKED_PARAMS["max_length"],
            validation_fraction=config.validation_fraction,
            seed=config.seed,
            cache_dir=str(work / "cache"),
        ),
        load_tokenizer(str(tiny_model_dir)),
    )
    return config, data


@pytest.mark.parametrize("packing", ["padding_free", "none"])
def test_a_packed_trial_counts_the_packers_sequences(chat: Any, packing: str) -> None:
    from analysis.timemodel.hardware import prior_coefficients
    from analysis.timemodel.model import predict
    from trainers.loop.trainer_setup import training_items
    from trainers.spec import full_run_steps

    config, data = chat
    params = {**PACKED_PARAMS, "packing": packing}
    model, path = str(config.model), str(config.data)
    lengths = [len(example.input_ids) for example in data.train]
    runs = trial_runs(config, params, model=model, data=path, train_lengths=lambda _: lengths)
    full, trial = runs.full_run, runs.trial
    # What the trainer itself feeds its micro-batches with: samples, or its packed sequences.
    items = training_items(full, data)
    steps = optimizer_steps(full, len(items))
    assert full.packing == trial.packing == packing
    assert full_run_steps(full, lengths) == steps
    assert trial.stop_after_steps == round(0.25 * steps)
    if packing == "padding_free":  # chat samples are short: several share a sequence
        assert len(items) < len(data.train) / 2
        assert steps < optimizer_steps(full, len(data.train))
    else:
        assert len(items) == len(data.train)
    # The time model's plan counts the same steps (the same packer, on the same lengths).
    hardware = this_machine("cpu", "fp32")
    plan = plan_of_spec(full, model_profile(str(config.model)), lengths, n_validation=1,
                    hardware=hardware)  # fmt: skip
    estimate = predict(plan, prior_coefficients(hardware, cpu_probe=lambda: 1e10))
    assert estimate.optimizer_steps == steps


def test_a_packed_trial_needs_the_lengths(chat: Any) -> None:
    config, data = chat
    params = {**PACKED_PARAMS, "packing": "padding_free"}
    with pytest.raises(ValueError, match="train_lengths"):
        trial_runs(config, params, model="m", data="d", train_samples=len(data.train))


@pytest.mark.parametrize(
    "allow, memory_gb, searched",
    [(False, None, False), (True, None, True), (False, 1e-4, True)],
    ids=["fits, not allowed", "allowed", "does not fit"],
)
def test_quantization_is_searched_where_allowed_or_needed(
    chat: Any, allow: bool, memory_gb: float | None, searched: bool
) -> None:
    """The tiny model's weights fit this machine; a 100 KB memory limit they do not."""
    config, _ = chat
    config = dataclasses.replace(
        config,
        allow_quantization=allow,
        budget=dataclasses.replace(config.budget, max_memory_gb=memory_gb),
    )
    prepared = prepare(config)
    assert "quantization" in prepared.space.domains  # the default space has the key
    estimator = StudyEstimator(config, prepared, cpu_probe=lambda: 1e10)
    assert estimator.base_fits() is (memory_gb is None)
    assert ("quantization" in estimator.prepared.space.domains) is searched
    assert "packing" in estimator.prepared.space.domains  # packing is searched everywhere


def test_the_preset_runs_packed(chat: Any, tmp_path: Path) -> None:
    """A packed configuration's preset: `trainers.train --preset` trains packed sequences."""
    from trainers.preset import preset_dict
    from trainers.train import main

    config, _ = chat
    params = {**PACKED_PARAMS, "packing": "padding_free"}
    full = full_run(config, params, model=str(config.model), data=str(config.data))
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(preset_dict(full, estimate={}, provenance={})))
    assert yaml.safe_load(path.read_text())["training"]["packing"] == "padding_free"
    report = tmp_path / "run.json"
    argv = ["--preset", str(path), "--max-steps", "2", "--output-dir", str(tmp_path / "run"),
            "--json", str(report), "--quiet"]  # fmt: skip
    assert run_cli(main, argv) == 0
    result = json.loads(report.read_text())
    assert (result["spec"]["packing"], result["spec"]["quantization"]) == ("padding_free", "none")
    # 2 steps of 3 micro-batches of 2 packed sequences: more samples than sequence slots.
    assert result["samples_seen"] > 2 * 3 * 2
