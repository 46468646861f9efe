"""What a study's own full runs measured, read from a real MLflow store as trainers.train
leaves it (tags, params, the final loss metric)."""

from __future__ import annotations

from pathlib import Path

from mlflow import MlflowClient

from hpo.full_run_reports import full_run_results


def test_only_the_studys_finished_full_runs_on_its_data_are_read(tmp_path: Path) -> None:
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("hpo-lora")
    data = tmp_path / "data.jsonl"

    def full_run(
        study: str, trial: str, status: str, loss: float | None, on: Path, best: bool = False
    ) -> str:
        tags = {"hpo.role": "full_training", "hpo.study_name": study, "status": status}
        run_id = client.create_run(experiment, tags={**tags, "hpo.trial_number": trial}).info.run_id
        client.log_param(run_id, "data", str(on))
        if loss is not None:
            client.log_metric(run_id, "val_loss_final", loss + 0.3)  # where it stopped
            client.log_metric(run_id, "val_loss_best" if best else "val_loss_final", loss)
        if best:  # as trainers.tracking logs a run with a best evaluation
            client.log_metric(run_id, "best_step", 40)
        client.set_terminated(run_id)
        return run_id

    kept = full_run("s", "3", "finished", 2.5, data)
    full_run("other", "3", "finished", 1.0, data)  # another study of the experiment
    full_run("s", "4", "stopped_by_window", 1.5, data)  # its last loss is not the end's
    full_run("s", "4", "stopped_by_signal", 1.4, data, best=True)  # nor is its best
    early = full_run("s", "7", "stopped_early", 2.2, data, best=True)  # its best checkpoint
    full_run("s", "8", "stopped_early", 2.1, data)  # logged before val_loss_best: unknown
    full_run("s", "5", "finished", None, data)  # no final loss
    full_run("s", "", "finished", 1.1, data)  # trained without a preset: no trial
    full_run("s", "6", "finished", 1.2, tmp_path / "other.jsonl")  # --data over the preset's
    client.create_run(experiment, tags={"hpo.role": "trial", "hpo.study_name": "s"})

    found = full_run_results(client, experiment, "s", str(data))
    assert sorted((r.run_id, r.trial, r.loss, r.best_step) for r in found) == sorted(
        [(kept, 3, 2.5, None), (early, 7, 2.2, 40)]
    )
    # The same file named another way is the same data; without the study's path, any data.
    again = full_run_results(client, experiment, "s", str(tmp_path / "." / "data.jsonl"))
    assert {r.run_id for r in again} == {kept, early}
    assert {r.trial for r in full_run_results(client, experiment, "s")} == {3, 6, 7}
