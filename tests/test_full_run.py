"""Full runs on the tiny model: window stop, checkpoints, resume, fallback, recovery, CLI."""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from common.cli import run_cli
from common.errors import BadInputError, GaveUp, TrainingFailed
from tests.cli import start_module
from tests.servers import only_finished_run
from trainers.data.paths import demo_data_path
from trainers.events import StepInfo, TrainingCallback
from trainers.loop import checkpoint
from trainers.loop.measured import MeasuredTrainer
from trainers.loop.run import train
from trainers.loop.window import WindowGuard
from trainers.preset import preset_dict
from trainers.spec import LoraSpec, RecoverySpec, TrainSpec
from trainers.train import main


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("token-cache")


RECOVER = RecoverySpec(enabled=True)  # a failed step (out of memory, NaN loss) is retried


def _spec(model: Path, out: Path, cache: Path, **overrides: object) -> TrainSpec:
    values: dict[str, object] = {
        "model": str(model),
        "data": str(demo_data_path("prompt_completion")),
        "output_dir": str(out),
        "lora": LoraSpec(r=8, alpha=16),
        "micro_batch_size": 8,
        "learning_rate": 3e-3,
        "max_steps": 12,
        "eval_interval": 4,
        "eval_samples": 16,
        "checkpoint_interval": 4,
        "keep_checkpoints": 2,
        "cache_dir": str(cache),
    }
    values.update(overrides)
    return TrainSpec(**values)  # type: ignore[arg-type]


class Steps(TrainingCallback):
    """Records every step; optionally stops at one, or raises an error once at one."""

    def __init__(self, stop_at: int | None = None, fail_at: int | None = None) -> None:
        self.steps: list[StepInfo] = []
        self.stop_at = stop_at
        self.fail_at = fail_at

    def on_step(self, info: StepInfo) -> bool:
        self.steps.append(info)
        if info.step == self.fail_at:
            self.fail_at = None
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return info.step == self.stop_at


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("uninterrupted") / "out"
    return train(_spec(tiny_model_dir, out, cache_dir)), out


def test_checkpoints_are_verified_and_rotated(uninterrupted) -> None:
    result, out = uninterrupted
    assert result.status == "finished" and result.final_step == 12
    assert len(result.checkpoint_seconds) == 3  # steps 4, 8, 12: the time model's input
    # Keep the newest 2; the best validation loss (step 12 here) is among them.
    assert [step for step, _ in checkpoint.checkpoints(out)] == [8, 12]
    assert not list(out.glob(".staging-*"))
    newest = out / "checkpoint-12"
    assert result.checkpoint_dir == str(newest.resolve())
    assert checkpoint.verify(newest) is None
    manifest = json.loads((newest / checkpoint.MANIFEST).read_text())
    assert set(checkpoint.REQUIRED) <= set(manifest["files"])
    assert not (newest / "training_args.bin").exists()  # no pickled objects
    state = checkpoint.read_run_state(newest)
    assert state["step"] == 12 and state["val_loss"] == pytest.approx(result.final_eval_loss)


def test_resume_continues_at_the_right_step_with_the_same_losses(
    uninterrupted, tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    reference, _ = uninterrupted
    spec = _spec(tiny_model_dir, tmp_path / "out", cache_dir)
    stopped = train(spec, [Steps(stop_at=6)])
    assert (stopped.status, stopped.final_step) == ("stopped", 6)
    assert stopped.checkpoint_dir and checkpoint.verify(stopped.checkpoint_dir) is None

    steps = Steps()
    resumed = train(spec, [steps], resume=True)
    assert resumed.resumed_from_step == 6 and resumed.status == "finished"
    assert [s.step for s in steps.steps] == list(range(7, 13))
    expected = dict((int(s), loss) for s, loss in reference.train_losses)
    for step, loss in resumed.train_losses:
        assert loss == pytest.approx(expected[int(step)], abs=1e-4), step
    assert [s for s, _ in resumed.eval_losses] == [8, 12]
    assert [loss for _, loss in resumed.eval_losses] == pytest.approx(
        [loss for _, loss in reference.eval_losses[1:]], abs=1e-4
    )
    assert resumed.cumulative_wall_seconds > resumed.wall_seconds


def _truncate(path: Path) -> None:
    file = path / "adapter_model.safetensors"
    file.write_bytes(file.read_bytes()[:100])


def _flip_a_byte(path: Path) -> None:
    file = path / "optimizer.pt"
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


def _lose_the_manifest(path: Path) -> None:
    (path / checkpoint.MANIFEST).unlink()


@pytest.mark.parametrize("corrupt", [_truncate, _flip_a_byte, _lose_the_manifest])
def test_a_corrupted_latest_checkpoint_falls_back(
    uninterrupted, tmp_path: Path, caplog: pytest.LogCaptureFixture, corrupt
) -> None:
    _, out = uninterrupted
    copy = shutil.copytree(out, tmp_path / "out")
    corrupt(copy / "checkpoint-12")
    with caplog.at_level(logging.WARNING, logger="trainers.loop.checkpoint"):
        assert checkpoint.latest_valid(copy) == copy / "checkpoint-8"
    assert "checkpoint-12 is not usable" in caplog.text


def test_resume_skips_a_corrupted_checkpoint(
    uninterrupted, tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    _, out = uninterrupted
    copy = shutil.copytree(out, tmp_path / "out")
    _truncate(copy / "checkpoint-12")
    # Checkpoints by time now (every few milliseconds: after each step).
    spec = _spec(tiny_model_dir, copy, cache_dir, checkpoint_interval=0, checkpoint_minutes=1e-5)
    resumed = train(spec, resume=True)
    assert resumed.resumed_from_step == 8 and resumed.final_step == 12
    assert len(resumed.checkpoint_seconds) == 4  # steps 9, 10, 11, 12
    kept = [step for step, _ in checkpoint.checkpoints(copy)]
    assert kept[-2:] == [11, 12] and all(
        checkpoint.verify(copy / f"checkpoint-{s}") is None for s in kept
    )

    other_rank = _spec(tiny_model_dir, copy, cache_dir, lora=LoraSpec(r=4, alpha=8))
    with pytest.raises(BadInputError, match="rank 8"):
        train(other_rank, resume=True)


def test_window_of_a_few_seconds_stops_before_it_ends(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    guard = WindowGuard(window_seconds=6.0)
    spec = _spec(tiny_model_dir, tmp_path / "out", cache_dir, max_steps=5000, checkpoint_interval=0)
    result = train(spec, window=guard)
    assert result.status == "stopped_by_window" and result.stop_reason == "window"
    assert 1 <= result.final_step < 5000
    assert guard.clock() - guard.started_at < 6.0  # stopped, saved, and the window still open
    assert result.checkpoint_dir == str(tmp_path / "out" / f"checkpoint-{result.final_step}")
    assert checkpoint.verify(result.checkpoint_dir) is None


def test_out_of_memory_halves_the_micro_batch_and_keeps_the_effective_batch(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    spec = _spec(tiny_model_dir, tmp_path / "out", cache_dir, max_steps=8, recovery=RECOVER)
    steps = Steps(fail_at=6)
    result = train(spec, [steps])
    assert result.status == "finished" and result.final_step == 8
    assert (result.micro_batch_size, result.gradient_accumulation_steps) == (4, 2)
    assert len(result.recoveries) == 1 and "out of memory" in result.recoveries[0]
    seen = [s.step for s in steps.steps]
    assert seen[:6] == [1, 2, 3, 4, 5, 6] and seen[6] == 5  # back to the step-4 checkpoint
    rows = [
        t // n for t, n in zip(result.micro_step_tokens, result.micro_step_seq_len, strict=True)
    ]
    assert set(rows[-6:]) == {4}  # half micro-batches, two per optimizer step
    final = checkpoint.read_run_state(result.checkpoint_dir or "")
    assert (final["micro_batch_size"], final["gradient_accumulation_steps"]) == (4, 2)


def test_out_of_memory_at_micro_batch_one_gives_up(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    spec = _spec(tiny_model_dir, tmp_path / "out", cache_dir, micro_batch_size=1, recovery=RECOVER)
    with pytest.raises(GaveUp, match="micro-batch 1") as caught:
        train(spec, [Steps(fail_at=1)])
    assert caught.value.result is not None and caught.value.result.status == "gave_up"


@pytest.fixture()
def nan_loss_at(monkeypatch: pytest.MonkeyPatch):
    """`nan_loss_at(step)`: that step's loss becomes NaN, once (then the weights do too)."""

    def inject(step: int) -> None:
        original = MeasuredTrainer.compute_loss
        fired: list[bool] = []

        def compute_loss(self, model, inputs, *args, **kwargs):  # type: ignore[no-untyped-def]
            loss: Any = original(self, model, inputs, *args, **kwargs)
            if self.state.global_step == step - 1 and not fired:
                fired.append(True)
                return loss * float("nan")
            return loss

        monkeypatch.setattr(MeasuredTrainer, "compute_loss", compute_loss)

    return inject


def test_nan_loss_rolls_back_and_lowers_the_learning_rate(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path, nan_loss_at
) -> None:
    nan_loss_at(6)
    spec = _spec(
        tiny_model_dir,
        tmp_path / "out",
        cache_dir,
        max_steps=8,
        scheduler="constant",
        recovery=RecoverySpec(enabled=True, lr_factor=0.5),
    )
    steps = Steps()
    result = train(spec, [steps])
    assert result.status == "finished" and result.final_step == 8
    assert len(result.recoveries) == 1 and "nan at step 6" in result.recoveries[0]
    assert [s.step for s in steps.steps] == [*range(1, 6), *range(5, 9)]  # from checkpoint 4
    rates = [s.learning_rate for s in steps.steps]
    assert rates[:5] == pytest.approx([3e-3] * 5) and rates[5:] == pytest.approx([1.5e-3] * 4)
    assert all(loss == loss for _, loss in result.train_losses)  # no NaN left
    assert checkpoint.read_run_state(result.checkpoint_dir or "")["lr_scale"] == 0.5


def test_nan_loss_without_recovery_fails_the_run(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path, nan_loss_at
) -> None:
    nan_loss_at(2)
    spec = _spec(tiny_model_dir, tmp_path / "out", cache_dir, checkpoint_interval=0)
    with pytest.raises(TrainingFailed, match="training loss became nan at step 2"):
        train(spec)


def test_cli_bad_window_and_resume_requests_exit_2(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--model", str(tiny_model_dir), "--data", str(demo_data_path("text")), "--quiet"]
    out = ["--output-dir", str(tmp_path / "out")]
    assert run_cli(main, [*base, *out, "--window-hours", "1", "--safety-margin-minutes", "60"]) == 2
    assert "safety margin" in capsys.readouterr().err
    assert run_cli(main, [*base, *out, "--resume"]) == 2
    assert "no valid checkpoint" in capsys.readouterr().err


def test_cli_stops_at_the_window_with_exit_3_and_the_resume_command_finishes(
    tiny_model_dir: Path,
    cache_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = _spec(tiny_model_dir, tmp_path / "unused", cache_dir, max_steps=10, eval_samples=8)
    # A window whose deadline (window - margin) passes at once: the run stops at its first step.
    estimate = {
        "duration_hours": {"p50": 0.01},
        "window_hours": 0.001,
        # window - margin = 0.06 s: over before the first step ends, on any machine.
        "safety_margin_minutes": 0.059,
    }
    provenance = {"study": "demo", "mlflow_parent_run_id": "not-in-this-store"}
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump(preset_dict(spec, estimate=estimate, provenance=provenance)))
    out, report = tmp_path / "run", tmp_path / "r.json"
    argv = ["--preset", str(preset), "--output-dir", str(out), "--json", str(report), "--quiet"]
    monkeypatch.chdir(tmp_path)
    assert run_cli(main, argv) == 3
    stopped = json.loads(report.read_text())
    assert stopped["status"] == "stopped_by_window" and stopped["final_step"] == 1
    assert checkpoint.verify(stopped["checkpoint_dir"]) is None
    lines = capsys.readouterr().out.splitlines()
    command = lines[lines.index("resume with:") + 1].strip()
    prefix = f"cd {tmp_path} && {sys.executable} -m trainers.train "
    assert command == prefix + " ".join(argv) + " --resume"

    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    resume_argv = shlex.split(command.removeprefix(prefix))
    assert run_cli(main, [*resume_argv, "--window-hours", "1", "--tracking-uri", tracking]) == 0
    done = json.loads(report.read_text())
    assert done["status"] == "finished" and done["final_step"] == 10
    assert done["resumed_from_step"] == 1 and done["recoveries"] == []
    assert done["predicted_seconds"] == pytest.approx(36.0)

    client, run = only_finished_run(tracking, "hpo-lora")
    assert run.data.tags["hpo.study_name"] == "demo"
    assert run.data.tags["hpo.parent_run_id"] == "not-in-this-store"
    for key in ("train_loss", "val_loss", "tokens_per_second", "step_time_s"):
        assert key in run.data.metrics, key
    assert run.data.metrics["predicted_seconds"] == pytest.approx(36.0)
    assert run.data.metrics["actual_seconds"] > 0
    history = client.get_metric_history(run.info.run_id, "train_loss")
    assert [m.step for m in history] == list(range(2, 11))


def test_a_smoke_test_of_a_preset_is_not_taken_for_its_full_run(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow import MlflowClient

    from analysis.calibration.full_runs import FullRun
    from hpo.full_run_reports import full_run_results
    from trainers.preset import DEPARTS_TAG

    spec = _spec(tiny_model_dir, tmp_path / "unused", cache_dir, checkpoint_interval=0)
    band = {"p10": 1.0, "p50": 2.0, "p90": 4.0}
    hours = {"p10": 0.005, "p50": 0.01, "p90": 0.02}  # 18 s to 72 s
    estimate = {"duration_hours": hours, "final_val_loss": band,
                "final_val_loss_uncorrected_p50": 2.0}  # fmt: skip
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump(preset_dict(
        spec, estimate=estimate, provenance={"study": "demo", "trial": 3}
    )))  # fmt: skip
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def trained(name: str, *flags: str) -> tuple[dict[str, Any], list[str]]:
        report = tmp_path / f"{name}.json"
        argv = ["--preset", str(preset), "--output-dir", str(tmp_path / name), "--json",
                str(report), "--quiet", "--tracking-uri", tracking, *flags]  # fmt: skip
        assert run_cli(main, argv) == 0
        return json.loads(report.read_text()), capsys.readouterr().out.splitlines()

    smoke, smoke_out = trained("smoke", "--max-steps", "4", "--seed", "1")
    assert smoke["status"] == "finished" and smoke["final_step"] == 4
    assert smoke["preset_departures"] == {"max_steps": [12, 4]}  # the seed changes nothing
    assert any(line.startswith("not the preset's full run: max_steps 4") for line in smoke_out)
    assert not any(line.startswith(("duration:", "final validation loss:")) for line in smoke_out)
    assert smoke["predicted_seconds"] is None
    run = FullRun("smoke", smoke)
    assert run.loss_run() is None and run.shape_curve() is None
    assert run.measurements() is not None  # its steps still time the machine

    full, full_out = trained("full")
    assert full["preset_departures"] == {} and full["final_step"] == 12
    measured = full["final_eval_loss"]
    where = "inside p10-p90" if 1.0 <= measured <= 4.0 else "above p90" if measured > 4 else "below p10"
    assert (
        f"final validation loss: predicted 2.0000 (p10-p90 1.0000 to 4.0000), measured "
        f"{measured:.4f} (x{measured / 2:.2f}, {where})"
    ) in full_out
    (duration,) = [line for line in full_out if line.startswith("duration: predicted 36 s")]
    seconds = full["cumulative_wall_seconds"]
    where = "inside p10-p90" if 18 <= seconds <= 72 else "above p90" if seconds > 72 else "below p10"
    assert "(p10-p90 18 s to " in duration and duration.endswith(f"{where})")
    assert FullRun("full", full).loss_run() is not None

    # The study reads back its trial's full run, not the smoke test beside it.
    client = MlflowClient(tracking_uri=tracking)
    experiment = client.get_experiment_by_name("hpo-lora")
    assert experiment is not None
    runs = {r.data.tags.get(DEPARTS_TAG): r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"max_steps", None}
    assert "predicted_final_val_loss_p50" not in runs["max_steps"].data.metrics
    assert runs[None].data.metrics["predicted_final_val_loss_p50"] == 2.0
    found = full_run_results(client, experiment.experiment_id, "demo")
    assert [(r.run_id, r.trial, r.loss) for r in found] == [
        (runs[None].info.run_id, 3, pytest.approx(measured)),
    ]  # fmt: skip


def test_sigterm_stops_after_the_step_with_a_checkpoint_and_exit_3(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    import signal
    import time

    out, report = tmp_path / "run", tmp_path / "r.json"
    proc = start_module(
        "trainers.train",
        "--model", str(tiny_model_dir),
        "--data", str(demo_data_path("prompt_completion")),
        "--output-dir", str(out), "--cache-dir", str(cache_dir),
        "--max-steps", "100000", "--checkpoint-interval", "2", "--eval-interval", "0",
        "--json", str(report), "--quiet",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not list(out.glob("checkpoint-*")):  # the first checkpoint: training is under way
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 3, stderr
    result = json.loads(report.read_text())
    assert result["status"] == "stopped_by_signal" and result["stop_reason"] == "SIGTERM"
    assert 2 <= result["final_step"] < 100000
    # The step under way was finished and saved, not lost: the last checkpoint is the stop.
    assert Path(result["checkpoint_dir"]).name == f"checkpoint-{result['final_step']}"
    assert checkpoint.verify(result["checkpoint_dir"]) is None
    assert "SIGTERM received" in stderr
    assert (
        "resume with:" in stdout
        and f"stopped by SIGTERM at step {result['final_step']:,}" in stdout
    )


def test_a_resumed_training_continues_its_mlflow_run(
    tiny_model_dir: Path, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(tiny_model_dir, tmp_path / "unused", cache_dir, max_steps=8, eval_samples=8)
    # window - margin = 0.06 s: the first attempt stops at its first step on any machine.
    estimate = {"window_hours": 0.001, "safety_margin_minutes": 0.059}
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump(preset_dict(spec, estimate=estimate, provenance={})))
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "run"
    argv = ["--preset", str(preset), "--output-dir", str(out), "--quiet"]
    argv += ["--tracking-uri", tracking]
    monkeypatch.chdir(tmp_path)
    assert run_cli(main, argv) == 3
    # A fresh start into the same folder is refused and must not replace the recorded run.
    recorded = (out / "mlflow_run.json").read_text()
    assert run_cli(main, argv) == 2
    assert (out / "mlflow_run.json").read_text() == recorded
    assert run_cli(main, [*argv, "--resume", "--window-hours", "1"]) == 0

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking)
    experiment = client.get_experiment_by_name("hpo-lora")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], filter_string="attributes.status != 'FAILED'")
    (run,) = runs
    assert json.loads(recorded)["run_id"] == run.info.run_id
    assert run.info.status == "FINISHED"
    assert run.data.tags["resumed_from_step"] == "1"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
    assert sorted(steps) == list(range(1, 9))  # both attempts' steps, in one run
