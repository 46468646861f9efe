"""The training data as an MLflow dataset input and the adapter as an MLflow model, through the
writer's spool while the tracking server is away (a real SQLite store). The study's parent run
is checked in tests/test_study_e2e.py, a full run's on a real server in tests/test_adapter_model.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from common.mlflow_replay import replay
from common.mlflow_writer import MlflowWriter
from tests.servers import free_port
from trainers.data.lineage import DIGEST_LENGTH, dataset_input
from trainers.data.paths import demo_data_path
from trainers.data.sources import fingerprint, open_source


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


def check_dataset_input(
    client: MlflowClient, run_id: str, data: Path, rows: int, shape: str
) -> None:
    """The run has one dataset input: the data at `data`, with its fingerprint and rows."""
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


def test_a_dataset_input_and_a_model_wait_in_the_spool_and_arrive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = demo_data_path("prompt_completion")
    away = MlflowWriter(f"http://127.0.0.1:{free_port()}", spool_root=tmp_path / "spool")
    experiment = away.experiment_later("lineage")
    run = away.create_run_later(experiment, run_name="full", tags={})
    away.log_input(run, dataset_input(str(data), shape="prompt_completion", rows=3))
    model = tmp_path / "model"
    model.mkdir()
    (model / "MLmodel").write_text("flavors: {}\n")
    away.log_model(run, model, name="lora-adapter", tags={"trial": 2}, register_as="spooled")
    away.flush()
    assert away.waiting == 4  # experiment, run, input, model
    away.close()
    (model / "MLmodel").unlink()  # the spool holds its own copy

    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)  # the experiment's artifacts go to ./mlruns
    assert replay(tmp_path / "spool", tracking_uri=tracking) == (4, 0)
    client = MlflowClient(tracking)
    found = client.get_experiment_by_name("lineage")
    assert found is not None
    (stored,) = client.search_runs([found.experiment_id])
    check_dataset_input(client, stored.info.run_id, data, 3, "prompt_completion")
    (logged,) = client.search_logged_models([found.experiment_id])
    assert logged.source_run_id == stored.info.run_id and logged.tags["trial"] == "2"
    assert [a.path for a in client.list_logged_model_artifacts(logged.model_id)] == ["MLmodel"]
    (version,) = client.search_model_versions("name = 'spooled'")
    assert version.source == f"models:/{logged.model_id}" and version.tags["trial"] == "2"


@pytest.mark.parametrize(
    ("shape", "columns"),
    [("messages", ["messages"]), ("alpaca", ["instruction", "input", "output"])],
)
def test_the_schema_names_the_shapes_columns(shape: str, columns: list[str]) -> None:
    fields = dataset_input(str(demo_data_path("messages")), shape=shape, rows=1)
    assert [c["name"] for c in json.loads(fields["schema"])["mlflow_colspec"]] == columns
    assert len(fields["digest"]) <= 36  # what MLflow's store keeps


def test_a_conversational_prompt_completion_schema_names_its_messages(tmp_path: Path) -> None:
    """TRL's conversational prompt/completion: the schema says both columns are lists of
    messages, where a text prompt/completion file's are strings."""
    row = {"prompt": [{"role": "user", "content": "Hi"}],
           "completion": [{"role": "assistant", "content": "Hello."}]}  # fmt: skip
    chat = tmp_path / "pc.jsonl"
    chat.write_text("not json\n" + json.dumps(row) + "\n")  # a bad first line is skipped
    for path, kind in [(chat, "array"), (demo_data_path("prompt_completion"), "string")]:
        fields = dataset_input(str(path), shape="prompt_completion", rows=1)
        columns = json.loads(fields["schema"])["mlflow_colspec"]
        assert [(c["name"], c["type"]) for c in columns] == [("prompt", kind), ("completion", kind)]
    (prompt, _) = json.loads(dataset_input(str(chat), shape="prompt_completion", rows=1)["schema"])["mlflow_colspec"]
    assert set(prompt["items"]["properties"]) == {"role", "content"}


def test_columns_read_as_hpos_fields_keep_the_datas_names_in_the_schema(tmp_path: Path) -> None:
    """Dolly's rows read as Alpaca's (`data_columns`): the schema names the data's columns,
    as a user finds them in the file, and the profile says how each was read; a
    conversational prompt read from another column is still a list of messages."""
    dolly = tmp_path / "dolly.jsonl"
    dolly.write_text(json.dumps({"instruction": "Say hi.", "context": "", "response": "Hi."}) + "\n")
    fields = dataset_input(
        str(dolly), shape="alpaca", rows=1, columns="input=context,output=response"
    )
    names = [c["name"] for c in json.loads(fields["schema"])["mlflow_colspec"]]
    assert names == ["instruction", "context", "response"]
    assert json.loads(fields["profile"])["data_columns"] == "input=context,output=response"
    assert fields["digest"] == dataset_input(str(dolly), shape="alpaca", rows=1)["digest"]
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({
        "question": [{"role": "user", "content": "Hi"}],
        "answer": [{"role": "assistant", "content": "Hello."}],
    }) + "\n")  # fmt: skip
    from trainers.data.lineage import dataset_inputs

    ((read, _),) = dataset_inputs(
        str(chat), shape="prompt_completion", rows=1, validation_split=None, validation_rows=0,
        columns="prompt=question,completion=answer",
    )  # fmt: skip
    columns = json.loads(read["schema"])["mlflow_colspec"]
    assert [(c["name"], c["type"]) for c in columns] == [("question", "array"), ("answer", "array")]


def test_a_validation_split_is_the_runs_evaluation_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that validates on the data's own split records two dataset inputs: the train
    split (context training) and that split (context evaluation), each named and counted
    apart; without one, the data as before."""
    import datasets

    from trainers.data.lineage import dataset_inputs

    rows = [{"prompt": f"Q{i}", "completion": f" A{i}"} for i in range(7)]
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows[:5]), "test": datasets.Dataset.from_list(rows[5:])}
    ).save_to_disk(str(saved))
    away = MlflowWriter(f"http://127.0.0.1:{free_port()}", spool_root=tmp_path / "spool")
    run = away.create_run_later(away.experiment_later("splits"), run_name="full", tags={})
    inputs = dataset_inputs(str(saved), shape="prompt_completion", rows=7, validation_split="test", validation_rows=2)
    for dataset, context in inputs:
        away.log_input(run, dataset, context)
    away.flush()
    away.close()
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    replay(tmp_path / "spool", tracking_uri=tracking)
    client = MlflowClient(tracking)
    found = client.get_experiment_by_name("splits")
    assert found is not None
    (stored,) = client.search_runs([found.experiment_id])
    logged = {tags["mlflow.data.context"]: dataset for dataset, tags in _inputs(client, stored.info.run_id)}
    assert {k: v["name"] for k, v in logged.items()} == {"training": "saved:train", "evaluation": "saved:test"}
    profiles = {k: json.loads(v["profile"]) for k, v in logged.items()}
    assert (profiles["training"]["num_rows"], profiles["evaluation"]["num_rows"]) == (5, 2)
    assert logged["training"]["digest"] != logged["evaluation"]["digest"]  # each split's records
    ((alone, context),) = dataset_inputs(str(saved), shape="prompt_completion", rows=5, validation_split=None, validation_rows=0)
    assert context == "training" and alone["name"] == "saved"
