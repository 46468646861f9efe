"""A finished full run on a real `mlflow server`: its data (a `save_to_disk` folder) as the run's
dataset input; its LoRA adapter logged as the run's MLflow model, registered with
`--register-model`, and loaded back by MLflow's own loader with the logits of the adapter on
disk."""

from __future__ import annotations

import json
import os
from pathlib import Path

import datasets
import mlflow
import pytest
import torch
import yaml
from mlflow import MlflowClient

from common.cli import run_cli
from tests.servers import mlflow_server
from tests.test_mlflow_lineage import check_dataset_input
from trainers.adapter_model import ADAPTER_MODEL_NAME
from trainers.data.paths import demo_data_path


def test_the_adapter_is_logged_registered_and_loads_with_the_same_logits(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow.tracking._tracking_service.utils as tracking_utils
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.mlflow_store import process_tracking_uri
    from trainers.preset import preset_dict
    from trainers.spec import TrainSpec
    from trainers.train import main

    lines = demo_data_path("prompt_completion").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    data = tmp_path / "saved"
    datasets.disable_progress_bars()
    datasets.Dataset.from_list(rows).save_to_disk(str(data))
    spec = TrainSpec(
        model=str(tiny_model_dir), data=str(data), max_steps=3, eval_samples=8,
        learning_rate=5e-3,
    )  # fmt: skip
    preset = tmp_path / "preset.yaml"
    provenance = {"study": "demo-study", "trial": 4}
    preset.write_text(yaml.safe_dump(preset_dict(spec, estimate={}, provenance=provenance)))
    out = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "server").mkdir()
    held = tracking_utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    with mlflow_server(tmp_path / "server") as url:
        argv = ["--preset", str(preset), "--output-dir", str(out), "--quiet",
                "--tracking-uri", url, "--register-model", "tiny-adapter",
                "--json", str(tmp_path / "result.json"), "--system-metrics-seconds", "0"]  # fmt: skip
        assert run_cli(main, argv) == 0
        report = json.loads((tmp_path / "result.json").read_text())
        client = MlflowClient(url)
        experiment = client.get_experiment_by_name("hpo-lora")
        assert experiment is not None
        (run,) = client.search_runs([experiment.experiment_id])
        check_dataset_input(client, run.info.run_id, data, len(rows), "prompt_completion")
        (logged,) = client.search_logged_models([experiment.experiment_id])
        assert logged.name == ADAPTER_MODEL_NAME and logged.source_run_id == run.info.run_id
        assert [o.model_id for o in run.outputs.model_outputs] == [logged.model_id]
        (version,) = client.search_model_versions("name = 'tiny-adapter'")
        assert version.source == f"models:/{logged.model_id}" and version.run_id == run.info.run_id
        assert version.tags["study"] == "demo-study" and version.tags["trial"] == "4"
        assert float(version.tags["final_eval_loss"]) == pytest.approx(report["final_eval_loss"])
        assert version.tags["base_model"] == str(tiny_model_dir.resolve())

        with process_tracking_uri(url):
            loaded = mlflow.transformers.load_model(
                "models:/tiny-adapter/1", return_type="components"
            )["model"]
        # The process's URI as before the run: registering the adapter (the store's writer)
        # and loading it (above) each set it for a while; a URI left set would be kept over
        # its own by a later `MLflowCallback` in this process (transformers', TRL's).
        assert (tracking_utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")) == held
        # Adapter weights only: the base model is referenced, not copied into the store.
        stored = {p.name for p in (tmp_path / "server" / "artifacts").rglob("*") if p.is_file()}
        assert "adapter_model.safetensors" in stored and "model.safetensors" not in stored

    adapter_dir = Path(logged.tags["adapter_checkpoint"])
    on_disk = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = tokenizer(["What is two plus two?", "Name a colour."], return_tensors="pt", padding=True)
    on_disk.eval()
    loaded.eval()
    with torch.no_grad():
        expected, got = on_disk(**batch).logits, loaded(**batch).logits
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)
    # The adapter was trained: it moves the logits away from the base model's.
    with torch.no_grad(), on_disk.disable_adapter():
        assert not torch.allclose(on_disk(**batch).logits, expected, atol=1e-3)
