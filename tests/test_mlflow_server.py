"""What the MLflow UI would show, read through a real `mlflow server`'s REST API."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from hpo.config import load_config
from hpo.runner import run_study
from hpo.trial_runs import trial_schedule
from tests.servers import mlflow_server
from tests.spaces import unpacked_default_space


def _get(base: str, path: str, **query: str) -> Any:
    url = f"{base}/api/2.0/mlflow/{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def _post(base: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"{base}/api/2.0/mlflow/{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.timeout(900)
def test_ui_shows_parent_children_params_and_histories(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with mlflow_server(tmp_path) as base:
        config = load_config(
            None,
            {
                "model": str(tiny_model_dir),
                "work_dir": str(tmp_path / "work"),
                "study_name": "ui-check",
                "n_trials": 2,
                "trial_fraction": 0.06,
                "trial_evals": 2,
                "eval_samples": 8,
                "profiles": ["fast"],
                "pruner": "none",
                "rungs": "none",
                "tracking_uri": base,
                "experiment_name": "ui-check-exp",
                "space": unpacked_default_space(tmp_path),
            },
        )
        summary = run_study(config, progress=False)

        experiment = _get(base, "experiments/get-by-name", experiment_name="ui-check-exp")[
            "experiment"
        ]
        tags = {t["key"]: t["value"] for t in experiment.get("tags", [])}
        assert tags.get("mlflow.experimentKind") == "finetuning"
        runs = _post(base, "runs/search", {"experiment_ids": [experiment["experiment_id"]]})["runs"]
        by_id = {r["info"]["run_id"]: r for r in runs}
        parent = by_id[summary.mlflow_parent_run_id]
        assert parent["info"]["run_name"] == "ui-check"
        children = [
            r
            for r in runs
            if {t["key"]: t["value"] for t in r["data"].get("tags", [])}.get("mlflow.parentRunId")
            == summary.mlflow_parent_run_id
        ]
        assert len(children) == 2
        for child in children:
            params = {p["key"]: p["value"] for p in child["data"]["params"]}
            assert {
                "profile",
                "micro_batch_size",
                "gradient_accumulation_steps",
                "learning_rate",
                "lora_r",
            } <= set(params)
            assert params["profile"] == "fast"
            history = _get(
                base, "metrics/get-history", run_id=child["info"]["run_id"], metric_key="train_loss"
            )
            # 6 % of the trial's own full run, evaluated twice: at its middle and its end.
            trial = trial_schedule(int(params["full_run_steps"]), fraction=0.06, evals=2)
            steps = [m["step"] for m in history["metrics"]]
            assert steps == list(range(1, trial.stop_after_steps + 1)) and len(steps) >= 5
            val = _get(
                base, "metrics/get-history", run_id=child["info"]["run_id"], metric_key="val_loss"
            )
            evals = sorted(
                {
                    *range(trial.eval_interval, trial.stop_after_steps + 1, trial.eval_interval),
                    trial.stop_after_steps,
                }
            )
            assert [m["step"] for m in val["metrics"]] == evals
        # The runs table the study prints a link to answers too.
        with urllib.request.urlopen(base + "/", timeout=30) as response:
            assert response.status == 200
