"""Tiny versions of the families people fine-tune: each trains through `python -m trainers.train`
with LoRA auto targets that suit it, its profile counts what it instantiates, and its measured
peak memory stays inside the memory model's prior band. Family search spaces load and are
picked from the model's model_type.

Each family trains in its own process (`python -m trainers.train`), so its measured peak (the
process's resident memory on CPU) is its own run's, two at a time.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from analysis.planning.fits import plan_of_spec
from analysis.planning.inputs import load_model_config
from analysis.timemodel.hardware import prior_coefficients
from analysis.timemodel.machine import config_profile, model_profile, this_machine
from analysis.timemodel.model import predict
from benchmarks._held_out import lengths_of
from search_spaces import LogUniform, load_space
from search_spaces.families import (
    FAMILIES,
    describe_choice,
    family_of,
    family_path,
    load_family_space,
    lora_targets,
    space_for_model_type,
)
from tests.cli import run_module
from trainers.data.paths import demo_data_path
from trainers.model.lora import apply_lora, load_base_model
from trainers.spec import LoraSpec, TrainSpec
from trainers.tiny import FAMILIES as TINY_FAMILIES
from trainers.tiny import RECIPE_FILE, build_tiny

STEPS, MICRO_BATCH, MAX_LENGTH, RANK, EVAL_SAMPLES = 3, 4, 64, 4, 4


def spec_of(model: Path, work: Path) -> TrainSpec:
    """The run each family trains (the flags below say the same)."""
    return TrainSpec(
        model=str(model),
        data=str(demo_data_path("prompt_completion")),
        output_dir=str(work / "out"),
        lora=LoraSpec(r=RANK, alpha=2.0 * RANK),
        micro_batch_size=MICRO_BATCH,
        max_length=MAX_LENGTH,
        max_steps=STEPS,
        eval_samples=EVAL_SAMPLES,
        cache_dir=str(work / "cache"),
    )


def train_cli(family: str, root: Path) -> dict[str, Any]:
    work = root / family
    model = build_tiny(work / "model", arch=family)
    spec = spec_of(model, work)
    proc = run_module(
        "trainers.train", "--model", spec.model, "--data", spec.data,
        "--max-steps", str(STEPS), "--micro-batch-size", str(MICRO_BATCH),
        "--max-length", str(MAX_LENGTH), "--lora-r", str(RANK), "--lora-alpha", str(2 * RANK),
        "--eval-samples", str(EVAL_SAMPLES), "--output-dir", spec.output_dir,
        "--cache-dir", str(spec.cache_dir), "--json", str(work / "result.json"), "--quiet",
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((work / "result.json").read_text())
    # The report's own "spec" (the settings the run ran with, a dict) gives way to the TrainSpec.
    return {"model": model, "stderr": proc.stderr, **report, "spec": spec}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("families")
    with ThreadPoolExecutor(max_workers=2) as pool:  # two cores: two processes at a time
        results = pool.map(lambda family: train_cli(family, root), FAMILIES)
    return dict(zip(FAMILIES, results, strict=True))


def test_every_family_file_has_a_tiny_model() -> None:
    assert set(FAMILIES) <= set(TINY_FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_trains_three_steps_with_auto_targets(family: str, trained: dict[str, Any]) -> None:
    result = trained[family]
    assert result["optimizer_steps"] == STEPS
    assert math.isfinite(result["final_train_loss"]) and math.isfinite(result["final_eval_loss"])
    # The family file says which modules `auto` adapts; the run adapted exactly those.
    assert set(result["lora_targets"]) == set(lora_targets(family))
    assert result["trainable_parameters"] == RANK * result["lora_parameters_per_rank"]


def test_fused_projections_and_experts_are_adapted(trained: dict[str, Any]) -> None:
    assert {"qkv_proj", "gate_up_proj"} <= set(trained["phi3"]["lora_targets"])
    assert {"experts.gate_up_proj", "experts.down_proj"} <= set(trained["mixtral"]["lora_targets"])
    # LoRA on a fused expert tensor takes no dropout: the default 0.05 is dropped, said once.
    assert "lora.dropout=0.05 is not possible on mixtral" in trained["mixtral"]["stderr"]


@pytest.mark.parametrize("family", FAMILIES)
def test_profile_counts_what_the_model_instantiates(family: str, trained: dict[str, Any]) -> None:
    model_dir = trained[family]["model"]
    instantiated = AutoModelForCausalLM.from_pretrained(model_dir).num_parameters()
    from_folder = model_profile(model_dir)
    from_config_json = config_profile(load_model_config(model_dir / "config.json"))
    assert from_folder == from_config_json
    assert from_folder.total_parameters == instantiated
    result = trained[family]
    assert result["total_parameters"] - result["trainable_parameters"] == instantiated
    assert from_folder.lora_parameters_per_rank == result["lora_parameters_per_rank"]


@pytest.mark.parametrize("family", FAMILIES)
def test_measured_peak_memory_inside_the_prior_band(family: str, trained: dict[str, Any]) -> None:
    """The prior's p90 bounds the real peak (a plan that fits, fits) and its median is not
    more than 2x above it (on CPU the peak is the process's, mostly torch's own pages; a
    calibration fits that term: tests/test_memory_bound.py checks the calibrated band)."""
    result = trained[family]
    spec = result["spec"]
    hardware = this_machine("cpu", "fp32")
    lengths, n_validation = lengths_of(spec)
    plan = plan_of_spec(
        spec, model_profile(result["model"]), lengths, n_validation=n_validation, hardware=hardware
    )
    estimate = predict(plan, prior_coefficients(hardware, cpu_probe=lambda: 1e10))
    measured = result["peak_memory_bytes"]
    assert estimate.peak_memory_bytes / 2 < measured <= estimate.peak_memory_bytes_p90


def test_mistral_attends_through_a_sliding_window(trained: dict[str, Any]) -> None:
    config = AutoModelForCausalLM.from_pretrained(trained["mistral"]["model"]).config
    assert 0 < config.sliding_window < 512  # shorter than the context: the window matters
    # A token reaches one window further per layer: beyond layers x window it changes nothing.
    model = AutoModelForCausalLM.from_pretrained(trained["mistral"]["model"]).eval()
    window = config.sliding_window
    length = config.num_hidden_layers * window + 8
    ids = torch.randint(10, 600, (1, length), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, 0] = 11 if ids[0, 0] != 11 else 12
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, model(input_ids=changed).logits
    assert not torch.allclose(a[0, window - 2], b[0, window - 2])  # inside the window
    assert torch.allclose(a[0, -1], b[0, -1], atol=1e-5)  # outside it


def test_explicit_dropout_on_experts_falls_back_with_a_warning(
    trained: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        model, _ = apply_lora(load_base_model(str(trained["mixtral"]["model"])), LoraSpec(r=2))
    assert model.peft_config["default"].lora_dropout == 0.0
    assert any("lora.dropout=0.05" in r.message for r in caplog.records)


# ----------------------------------------------------------------------------- spaces


@pytest.mark.parametrize("family", FAMILIES)
def test_family_space_loads_with_recipe_ranges(family: str) -> None:
    space = load_family_space(family)
    rate = space.domains["learning_rate"]
    assert isinstance(rate, LogUniform)
    assert 1e-6 <= rate.low < rate.high <= 1e-3
    assert set(space.profiles) == set(load_space().profiles)
    assert family_of(family) == family


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_file_given_as_a_space_file_loads_as_the_family_space(family: str) -> None:
    """A user copies a family file to edit its ranges and passes it with --space: its
    lora_targets line (what LoRA auto adapts there, not a search key) was refused as an
    unknown key."""
    assert load_space(family_path(family)) == load_family_space(family)


def test_space_picked_from_model_type() -> None:
    assert space_for_model_type("mistral") == load_family_space("mistral")
    assert space_for_model_type("gpt2") == load_space()  # no family file: the default
    given = Path(str(resources.files("search_spaces").joinpath("default.yaml")))
    assert space_for_model_type("mistral", given) == load_space(given)  # --space wins


def test_study_prepare_picks_the_family_space(tmp_path: Path) -> None:
    """hpo.prepare: a mistral model gets the mistral space unless --space is given; a tiny
    model (built for tests, far smaller than the recipes' models) keeps the default."""
    from hpo.config import StudyConfig
    from hpo.prepare import prepare

    tiny = build_tiny(tmp_path / "tiny", arch="mistral")
    real = tmp_path / "mistral"
    shutil.copytree(tiny, real)
    (real / RECIPE_FILE).unlink()  # now it is just a mistral model folder
    data = str(demo_data_path("prompt_completion"))
    work = str(tmp_path / "work")
    family = prepare(StudyConfig(model=str(real), data=data, work_dir=work))
    assert family.max_length is not None
    assert family.space == load_family_space("mistral").with_max_length(family.max_length)
    default = prepare(StudyConfig(model=str(tiny), data=data, work_dir=work))
    assert default.max_length is not None
    assert default.space == load_space().with_max_length(default.max_length)


def test_the_choice_is_named() -> None:
    assert "mistral family" in describe_choice("mistral", None)
    assert describe_choice("gpt2", None) == (
        "default search space (no family file for model_type 'gpt2')"
    )
    assert describe_choice("mistral", "my.yaml") == "search space my.yaml (given)"
