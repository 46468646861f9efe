"""Loss and hours (or cost) as two objectives: a Pareto front, searched and exported.

One real multi-objective study (tiny llama, bundled data, TPE over loss and predicted
full-run hours); every claim below is checked on it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from common.cli import run_cli
from common.errors import BadInputError
from hpo.config import StudyConfig, load_config
from hpo.export import main as export_main
from hpo.runner import run_study
from hpo.samplers import make_sampler
from hpo.study import main as study_main
from hpo.summary import StudySummary


def _config(work: Path, model: Path, **overrides: Any) -> StudyConfig:
    values: dict[str, Any] = {
        "model": str(model),
        "work_dir": str(work),
        "study_name": "front",
        "objectives": ["loss", "hours"],
        "n_trials": 5,
        "trial_fraction": 0.05,
        "trial_evals": 3,
        "eval_samples": 8,
        "epochs": 0.5,
        "profiles": ["fast", "balanced"],
        "seed": 3,
        "reference_fraction": 0.0,  # no loss-shape reference run: the front is about trials
        "pruner": "hyperband",  # a configured pruner, which a multi-objective study leaves out
        "rungs": "none",
    }
    values.update(overrides)
    return load_config(None, values)


@dataclasses.dataclass
class Front:
    config: StudyConfig
    summary: StudySummary
    study: optuna.Study


@pytest.fixture(scope="module")
def front(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Front:
    config = _config(tmp_path_factory.mktemp("front"), tiny_model_dir)
    summary = run_study(config, progress=False)
    study = optuna.load_study(study_name="front", storage=config.storage_url)
    return Front(config, summary, study)


def test_the_study_minimises_loss_and_hours(front: Front) -> None:
    assert [d.name for d in front.study.directions] == ["MINIMIZE", "MINIMIZE"]
    complete = front.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(complete) >= 2
    for trial in complete:
        loss, hours = trial.values
        assert loss == pytest.approx(trial.user_attrs["predicted_final_loss"]["p50"], rel=0.2)
        assert hours == pytest.approx(trial.user_attrs["predicted_full_run_hours_p50"])
    # Optuna cannot prune a multi-objective trial on its curve: nothing is reported to it,
    # although the configured pruner (hyperband here) would otherwise have been used.
    assert front.config.pruner == "hyperband"
    assert all(not t.intermediate_values for t in front.study.trials)


def test_the_summary_lists_the_front(front: Front) -> None:
    points = front.summary.pareto_front
    complete = front.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert points and {p["trial"] for p in points} <= {t.number for t in complete}
    for point in points:  # no complete trial beats a front point on both objectives
        dominating = [
            t
            for t in complete
            if t.values[0] <= point["loss"]
            and t.values[1] <= point["hours"]
            and tuple(t.values) != (point["loss"], point["hours"])
        ]
        assert not dominating
    hours = [p["hours"] for p in points]
    losses = [p["loss"] for p in points]
    assert hours == sorted(hours) and losses == sorted(losses, reverse=True)
    assert front.summary.best_trial == points[-1]["trial"]  # the best loss, the longest run
    assert front.summary.best_value == pytest.approx(points[-1]["loss"])


def test_the_preset_is_the_best_loss_point(front: Front) -> None:
    assert front.summary.preset_path
    preset = yaml.safe_load(Path(front.summary.preset_path).read_text())
    assert preset["provenance"]["trial"] == front.summary.best_trial
    assert preset["provenance"]["picked_by"] == "best-loss point of the Pareto front"
    assert preset["estimate"]["fits_window"]


def test_cheapest_within_exports_a_front_point(front: Front, tmp_path: Path) -> None:
    points = front.summary.pareto_front
    out = tmp_path / "cheap.yaml"
    args = ["--study-name", "front", "--storage", front.config.storage_url, "--out", str(out),
            "--pick", "cheapest-within", "1000"]  # fmt: skip
    assert run_cli(export_main, args) == 0
    preset = yaml.safe_load(out.read_text())
    # Within 1000 % of the best loss every point qualifies: the cheapest one is taken.
    assert preset["provenance"]["trial"] == points[0]["trial"]
    assert preset["provenance"]["picked_by"].startswith("cheapest within 1000 %")


def test_the_report_reads_the_loss(front: Front) -> None:
    assert front.summary.report_path
    text = Path(front.summary.report_path).read_text()
    assert "Pareto front of loss (minimize) and hours (minimize)" in text
    folder = Path(front.summary.report_path).parent
    assert (folder / "history.png").stat().st_size > 0 and (folder / "pareto.png").exists()


def test_a_study_keeps_its_objectives(front: Front) -> None:
    one = dataclasses.replace(front.config, objectives=("loss",))
    before = len(front.study.trials)
    with pytest.raises(BadInputError, match=r"created with objectives \['loss', 'hours'\]"):
        run_study(one, progress=False)
    assert len(optuna.load_study(study_name="front", storage=one.storage_url).trials) == before


def test_cost_is_hours_times_the_price(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = _config(
        tmp_path, tiny_model_dir, objectives=["loss", "cost"], n_trials=2,
        price_per_hour=3.0, sampler="random", profiles=["fast"],
    )  # fmt: skip
    summary = run_study(config, progress=False)
    study = optuna.load_study(study_name="front", storage=config.storage_url)
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert complete
    for trial in complete:
        assert trial.values[1] == pytest.approx(
            3.0 * trial.user_attrs["predicted_full_run_hours_p50"]
        )
    assert all("cost" in point for point in summary.pareto_front)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"objectives": ["hours"]}, "objectives must be [loss], [loss, hours] or [loss, cost]"),
        ({"objectives": ["loss", "speed"]}, "but got ['loss', 'speed']"),
        ({"objectives": ["loss", "cost"]}, "needs budget.price_per_hour > 0"),
        (
            {"objectives": ["loss", "hours"], "sampler": "skopt"},
            "sampler skopt models one objective",
        ),
        ({"objectives": ["loss", "hours"], "sampler": "cmaes"}, "use tpe, nsga2, gp or random"),
    ],
)
def test_bad_objectives_are_refused(values: dict[str, Any], expected: str) -> None:
    with pytest.raises(BadInputError) as info:
        load_config(None, values)
    assert expected in str(info.value)


def test_objectives_from_flags_and_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config_file = tmp_path / "study.yaml"
    config_file.write_text("objectives: [loss, hours]\nsampler: nsga2\n")
    assert load_config(str(config_file)).objectives == ("loss", "hours")
    assert isinstance(make_sampler("nsga2", seed=0), optuna.samplers.NSGAIISampler)
    code = run_cli(study_main, ["--work-dir", str(tmp_path), "--objectives", "loss,time"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "['loss', 'time']" in err[0]
    assert not (tmp_path / "optuna.db").exists()
