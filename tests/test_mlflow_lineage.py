"""The training data as an MLflow dataset input: on the study's parent run, on a full run, and
through the writer's spool while the tracking server is away (real SQLite stores)."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import yaml
from mlflow import MlflowClient

from common.cli import run_cli
from common.mlflow_writer import MlflowWriter, replay
from tests.servers import free_port
from trainers.data.lineage import DIGEST_LENGTH, dataset_input
from trainers.data.paths import demo_data_path
from trainers.data.sources import fingerprint, open_source


def _demo_rows() -> list[dict[str, str]]:
    lines = demo_data_path("prompt_completion").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _inputs(client: MlflowClient, run_id: str) -> list[tuple[dict[str, str], dict[str, str]]]:
    """(dataset fields, input tags) of each dataset input of a run."""
    run = client.get_run(run_id)
    assert run.inputs is not None
    return [
        (
            {
                "name": i.dataset.name,
                "digest": i.dataset.digest,
                "source_type": i.dataset.source_type,
                "source": i.dataset.source,
                "profile": i.dataset.profile,
                "schema": i.dataset.schema,
            },
            {tag.key: tag.value for tag in i.tags},
        )
        for i in run.inputs.dataset_inputs
    ]


def _check_input(client: MlflowClient, run_id: str, data: Path, rows: int, shape: str) -> None:
    (dataset, tags), *others = _inputs(client, run_id)
    assert not others
    assert tags == {"mlflow.data.context": "training"}
    source = open_source(data)
    assert dataset["digest"] == fingerprint(source).removeprefix("datasets:")[:DIGEST_LENGTH]
    assert dataset["name"] == data.name and dataset["source_type"] == "local"
    assert json.loads(dataset["source"]) == {"uri": str(data.resolve())}
    profile = json.loads(dataset["profile"])
    assert (profile["num_rows"], profile["shape"]) == (rows, shape)
    assert [c["name"] for c in json.loads(dataset["schema"])["mlflow_colspec"]] == [
        "prompt",
        "completion",
    ]


def test_the_study_parent_run_logs_its_parquet_data(tmp_path: Path, tiny_model_dir: Path) -> None:
    from hpo.study import main
    from hpo.tracking import PARENT_ATTR

    rows = _demo_rows()
    data = tmp_path / "train.parquet"
    datasets.disable_progress_bars()
    datasets.Dataset.from_list(rows).to_parquet(str(data))
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    work = tmp_path / "work"
    argv = [
        "--no-progress", "--model", str(tiny_model_dir), "--work-dir", str(work),
        "--data", str(data), "--tracking-uri", tracking, "--study-name", "lineage",
        "--n-trials", "1", "--trial-fraction", "0.015", "--trial-evals", "2",
        "--eval-samples", "8", "--pruner", "none", "--profiles", "fast",
    ]  # fmt: skip
    assert run_cli(main, argv) == 0
    import optuna

    study = optuna.load_study(study_name="lineage", storage=f"sqlite:///{work / 'optuna.db'}")
    _check_input(
        MlflowClient(tracking), study.user_attrs[PARENT_ATTR], data, len(rows), "prompt_completion"
    )


def test_a_full_run_logs_its_saved_dataset(tmp_path: Path, tiny_model_dir: Path) -> None:
    from trainers.preset import preset_dict
    from trainers.spec import TrainSpec
    from trainers.train import main

    rows = _demo_rows()
    data = tmp_path / "saved"
    datasets.disable_progress_bars()
    datasets.Dataset.from_list(rows).save_to_disk(str(data))
    spec = TrainSpec(model=str(tiny_model_dir), data=str(data), max_steps=2, eval_samples=8)
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump(preset_dict(spec, estimate={}, provenance={})))
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["--preset", str(preset), "--output-dir", str(tmp_path / "run"), "--quiet"]
    assert run_cli(main, [*argv, "--tracking-uri", tracking]) == 0
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name("hpo-lora")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    _check_input(client, run.info.run_id, data, len(rows), "prompt_completion")


def test_a_dataset_input_waits_in_the_spool_and_arrives(tmp_path: Path) -> None:
    data = demo_data_path("prompt_completion")
    away = MlflowWriter(f"http://127.0.0.1:{free_port()}", spool_root=tmp_path / "spool")
    experiment = away.experiment_later("lineage")
    run = away.create_run_later(experiment, run_name="full", tags={})
    away.log_input(run, dataset_input(str(data), shape="prompt_completion", rows=3))
    away.flush()
    assert away.waiting == 3  # experiment, run, input
    away.close()

    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert replay(tmp_path / "spool", tracking_uri=tracking) == (3, 0)
    client = MlflowClient(tracking)
    found = client.get_experiment_by_name("lineage")
    assert found is not None
    (stored,) = client.search_runs([found.experiment_id])
    _check_input(client, stored.info.run_id, data, 3, "prompt_completion")


@pytest.mark.parametrize(
    ("shape", "columns"),
    [("messages", ["messages"]), ("alpaca", ["instruction", "input", "output"])],
)
def test_the_schema_names_the_shapes_columns(shape: str, columns: list[str]) -> None:
    fields = dataset_input(str(demo_data_path("messages")), shape=shape, rows=1)
    assert [c["name"] for c in json.loads(fields["schema"])["mlflow_colspec"]] == columns
    assert len(fields["digest"]) <= 36  # what MLflow's store keeps
