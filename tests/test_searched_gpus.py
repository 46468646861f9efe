"""The GPU count of a full run as a searched choice (`gpus: {choice: [...]}` in the space).

Each configuration's full run is judged on its own N (window, memory per GPU, cost), its
trial trains on one GPU with the accumulation x N, and the pick's preset and the summary's
"train it" line carry the pick's N.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from common.errors import BadInputError
from hpo.config import StudyConfig
from hpo.export import exported_full_run
from hpo.runner import run_study
from hpo.what_fits import candidates
from search_spaces import load_space
from search_spaces.sampling import params_from_trial_params, sample
from search_spaces.space import parse_space
from tests.cli import run_module
from tests.configs import short_study
from tests.test_gpus_per_run import PARAMS, _config, _estimator

SPACE = {
    "profile": {"choice": ["fast"]},
    "learning_rate": {"loguniform": [1e-4, 1e-3]},
    "lora_r": {"choice": [4]},
    "lora_alpha_ratio": 2,
    "lora_dropout": 0.0,
}


def _space(**extra: Any) -> Any:
    return parse_space({**SPACE, **extra}, profiles=load_space().with_max_length(128).profiles)


def test_the_space_takes_whole_gpu_counts_only() -> None:
    assert _space(gpus={"choice": [1, 2, 4]}).domains["gpus"].values == (1, 2, 4)
    for bad in ({"choice": [0, 2]}, {"choice": [1.5]}, {"uniform": [1, 4]}):
        with pytest.raises(BadInputError, match="^gpus: "):
            _space(gpus=bad)


def test_a_sampled_gpu_count_is_part_of_the_effective_batch() -> None:
    space = _space(gpus={"choice": [4]}, learning_rate_scaling="linear", reference_batch_size=8)
    trial = optuna.create_study().ask()
    params = sample(trial, space)
    assert params["gpus"] == 4
    effective = params["micro_batch_size"] * params["gradient_accumulation_steps"] * 4
    assert params["learning_rate"] == pytest.approx(params["base_learning_rate"] * effective / 8)


def test_a_budget_gpu_count_scales_the_learning_rate_as_a_searched_one() -> None:
    searched = _space(gpus={"choice": [4]}, learning_rate_scaling="linear", reference_batch_size=8)
    budget = _space(learning_rate_scaling="linear", reference_batch_size=8)
    trial = optuna.create_study().ask()
    on_four = sample(trial, searched)
    params = {key: value for key, value in trial.params.items() if key != "gpus"}
    # budget.gpus_per_run 4: the objective passes the study's count.
    assert params_from_trial_params(params, budget, gpus=4)["learning_rate"] == pytest.approx(
        on_four["learning_rate"]
    )
    on_one = params_from_trial_params(params, budget)
    assert on_one["learning_rate"] == pytest.approx(on_four["learning_rate"] / 4)
    assert on_one["base_learning_rate"] == on_four["base_learning_rate"]


def test_each_configuration_is_judged_on_its_own_gpu_count() -> None:
    # 100 s window: on one GPU the configuration needs 250 s, on four about 64 s (the hand
    # counts of tests/test_gpus_per_run.py).
    estimator = _estimator(_config(window_hours=100 / 3600, price_per_hour=2))
    one, four = (estimator.verdict({**PARAMS, "gpus": n}) for n in (1, 4))
    assert (one.full_run.gpus, one.feasible) == (1, False)
    assert (four.full_run.gpus, four.feasible) == (4, True)
    assert four.trial_run.gpus == 1
    # The feasibility walk over the space sees every searched count.
    space = _space(gpus={"choice": [1, 4]})
    assert {c["gpus"] for c in candidates(space, ["fast"])} == {1, 4}
    assert all("gpus" not in c for c in candidates(_space(), ["fast"]))


def test_a_study_searches_the_gpu_count_and_its_preset_carries_the_picks(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump({**SPACE, "gpus": {"choice": [1, 2]}}))
    config: StudyConfig = short_study(
        tmp_path / "work",
        tiny_model_dir,
        {"n_trials": 4, "space": str(space_file), "device": "cpu", "seed": 3},
    )
    summary = run_study(config, progress=False)
    study = optuna.load_study(study_name=config.study_name, storage=config.storage_url)
    trained = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert trained and {t.params["gpus"] for t in study.trials} <= {1, 2}
    for t in trained:
        assert exported_full_run(study, t).gpus == t.params["gpus"]  # what its preset would run
        attrs = t.user_attrs
        n = t.params["gpus"]
        assert attrs["effective_batch_size"] == (
            attrs["micro_batch_size"] * attrs["gradient_accumulation_steps"] * n
        )
    best = study.trials[summary.best_trial]
    preset = yaml.safe_load(Path(summary.preset_path).read_text(encoding="utf-8"))
    assert preset["training"]["gpus"] == best.params["gpus"]
    assert preset["launch"]["gpus"] == best.params["gpus"]
    if best.params["gpus"] > 1:
        assert "CPU processes" in summary.launch_note
    else:
        assert summary.launch_note == ""


def test_a_budget_gpu_count_beside_a_searched_one_exits_2(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump({**SPACE, "gpus": {"choice": [1, 2]}}))
    work = tmp_path / "work"
    result = run_module(
        "hpo.study", "--model", tiny_model_dir, "--work-dir", work, "--space", space_file,
        "--gpus-per-run", "2", timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "budget.gpus_per_run 2 and the space's gpus" in lines[0]
    assert not (work / "optuna.db").exists()
