"""One run on two processes: real torchrun, gloo on the CPU, transformers' Trainer DDP.

`trainers.train --gpus 2 --device cpu` starts two processes through torchrun. At micro-batch
4 on each they take the same 8 samples per optimizer step as one process at micro-batch 8
(accelerate's sharded sampler gives process k the k-th 4 of each 8 of one seeded order), and
DDP averages gradients normalised by the tokens of all processes: in fp32 the two runs'
losses agree to float rounding (about 1e-7 here), so 1e-4 has three orders of margin. LoRA
dropout is off: each process draws its own masks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.cli import run_module, start_module
from tests.servers import only_finished_run
from trainers.launch import check_gpus, idle_gpus_hint, report_exit, torchrun_command
from trainers.loop import checkpoint
from trainers.loop.distributed import Processes, processes
from trainers.loop.run import check_processes
from trainers.spec import TrainSpec, optimizer_steps

STEPS = 6


def _argv(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--model",
        str(model),
        "--data",
        str(data),
        "--output-dir",
        str(out),
        "--cache-dir",
        str(out.parent / "cache"),
        "--device",
        "cpu",
        "--lora-dropout",
        "0",
        "--max-steps",
        str(STEPS),
        "--eval-interval",
        "3",
        "--eval-samples",
        "16",
        "--checkpoint-interval",
        "3",
        "--quiet",
        *extra,
    ]


@pytest.fixture(scope="module")
def two_runs(tiny_model_dir: Path, small_data: Path, tmp_path_factory: pytest.TempPathFactory):
    """The same run on one process at micro-batch 8 and on two at 4, with their reports."""
    tmp = tmp_path_factory.mktemp("ddp")
    tracking = f"sqlite:///{tmp / 'mlflow.db'}"
    reports = {}
    for gpus, micro in ((1, 8), (2, 4)):
        out = tmp / f"out{gpus}"
        report = tmp / f"report{gpus}.json"
        argv = _argv(tiny_model_dir, small_data, out, "--micro-batch-size", str(micro))
        argv += ["--gpus", str(gpus), "--json", str(report)]
        if gpus == 2:
            argv += ["--tracking-uri", tracking, "--experiment-name", "ddp"]
        done = run_module("trainers.train", *argv, env=_env())
        assert done.returncode == 0, done.stderr[-3000:]
        reports[gpus] = (json.loads(report.read_text()), out, done)
    return reports, tracking


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def test_two_processes_match_one_at_the_same_effective_batch(two_runs) -> None:
    reports, _ = two_runs
    one, two = reports[1][0], reports[2][0]
    assert [s for s, _ in two["train_losses"]] == list(range(1, STEPS + 1))  # each step once
    for (_, a), (_, b) in zip(one["train_losses"], two["train_losses"], strict=True):
        assert b == pytest.approx(a, rel=1e-4)
    for (_, a), (_, b) in zip(one["eval_losses"], two["eval_losses"], strict=True):
        assert b == pytest.approx(a, rel=1e-4)
    # Samples counted once over both processes: 8 per optimizer step.
    assert one["samples_seen"] == two["samples_seen"] == 8 * STEPS
    # Each process scored every second validation sample, longest first: process 0 (the
    # report's) the longer of each pair, so at least half the tokens, and fewer than all.
    for whole, share in zip(one["eval_records"], two["eval_records"], strict=True):
        assert whole["tokens"] / 2 <= share["tokens"] < whole["tokens"]
    assert two["spec"]["gpus"] == 2 and two["spec"]["micro_batch_size"] == 4


def test_grouped_by_length_two_processes_take_the_steps_of_one(
    tiny_model_dir: Path, small_data: Path, tmp_path: Path
) -> None:
    """The sampler groups one step of both processes: the order a one-GPU trial trains."""
    losses = {}
    for gpus, micro in ((1, 8), (2, 4)):
        report = tmp_path / f"report{gpus}.json"
        argv = _argv(tiny_model_dir, small_data, tmp_path / f"out{gpus}", "--micro-batch-size")
        argv += [str(micro), "--gpus", str(gpus), "--packing", "group_by_length"]
        done = run_module("trainers.train", *argv, "--json", str(report), env=_env())
        assert done.returncode == 0, done.stderr[-3000:]
        losses[gpus] = [loss for _, loss in json.loads(report.read_text())["train_losses"]]
    assert len(losses[2]) == STEPS
    assert losses[2] == pytest.approx(losses[1], rel=1e-4)


def test_process_zero_alone_writes_the_checkpoints_and_the_summary(two_runs) -> None:
    reports, _ = two_runs
    _, out, done = reports[2]
    saved = [step for step, _ in checkpoint.checkpoints(out)]
    assert saved == [3, 6]
    for _, folder in checkpoint.checkpoints(out):
        assert checkpoint.verify(folder) is None
        names = {p.name for p in folder.iterdir()}
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= names  # each process's own
        assert checkpoint.read_run_state(folder)["gpus"] == 2
    assert not list(out.glob(".staging-*"))
    assert done.stdout.count("best validation loss") == 1  # one summary, not one per process


def test_one_mlflow_run_for_two_processes(two_runs) -> None:
    _, tracking = two_runs
    client, run = only_finished_run(tracking, "ddp")
    assert run.data.params["gpus"] == "2"
    assert run.data.params["effective_batch_size"] == "8"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
    assert sorted(steps) == list(range(1, STEPS + 1))


def test_the_window_stops_both_processes_at_one_step_and_a_resume_needs_as_many(
    tiny_model_dir: Path, small_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    argv = _argv(tiny_model_dir, small_data, out, "--micro-batch-size", "4", "--gpus", "2")
    # A 1 s window: starting two processes takes longer, so process 0 stops at step 1.
    window = ["--window-hours", str(1 / 3600), "--safety-margin-minutes", "0"]
    done = run_module("trainers.train", *argv, *window, env=_env())
    assert done.returncode == 3, done.stderr[-3000:]
    assert "resume with:" in done.stdout and "--gpus 2" in done.stdout
    ((step, folder),) = checkpoint.checkpoints(out)
    assert step == 1
    # Process 1 wrote its state into the checkpoint of step 1: it stopped there too.
    assert (folder / "rng_state_1.pth").is_file() and checkpoint.verify(folder) is None

    wrong = run_module("trainers.train", *argv[:-1], "1", "--resume", env=_env())
    assert wrong.returncode == 2
    (line,) = wrong.stderr.strip().splitlines()
    assert "gpus=1" in line and "--gpus 2" in line

    resumed = run_module("trainers.train", *argv, "--resume", "--json", str(tmp_path / "r.json"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["resumed_from_step"] == 1 and report["final_step"] == STEPS
    assert [s for s, _ in report["train_losses"]] == list(range(2, STEPS + 1))


def _process_of_rank(launcher: int, rank: int) -> psutil.Process:
    for child in psutil.Process(launcher).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "trainers" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"no training process of rank {rank} under {launcher}")


# To the launcher's process group (a scheduler's or a terminal's signal: the launcher passes
# it on to each process once, and torchrun, in a session of its own, does not see it; before,
# each process took it twice and the second killed it), or to process 1 alone (process 0,
# which writes the summary, learns of it only by agreeing).
@pytest.mark.parametrize("target", ["process group", "process 1"])
def test_a_sigterm_stops_both_processes_with_a_checkpoint(
    tiny_model_dir: Path, small_data: Path, tmp_path: Path, target: str
) -> None:
    out = tmp_path / "out"
    argv = _argv(tiny_model_dir, small_data, out, "--micro-batch-size", "4", "--gpus", "2")
    argv[argv.index("--max-steps") + 1] = "100000"
    argv += ["--report-every", "1"]
    child = start_module("trainers.train", *argv, env=_env(), start_new_session=True)
    assert child.stderr is not None
    deadline = time.monotonic() + 240
    for line in child.stderr:  # forecasts go to stderr: the processes are training
        if line.startswith("step ") or time.monotonic() > deadline:
            break
    if target == "process group":
        os.killpg(child.pid, signal.SIGTERM)
    else:
        _process_of_rank(child.pid, 1).send_signal(signal.SIGTERM)
    stdout, stderr = child.communicate(timeout=240)
    assert child.returncode == 3
    assert "stopped by SIGTERM" in stdout
    # torchrun never took the signal: given one, it kills its processes 30 s on, whether
    # their step and checkpoint are done or not.
    assert "death signal" not in stderr
    ((step, folder),) = checkpoint.checkpoints(out)
    assert 1 <= step < 100000
    assert (folder / "rng_state_1.pth").is_file() and checkpoint.verify(folder) is None


def test_more_gpus_than_devices_is_bad_input(
    tiny_model_dir: Path, small_data: Path, tmp_path: Path
) -> None:
    argv = _argv(tiny_model_dir, small_data, tmp_path / "out", "--gpus", "2")
    argv[argv.index("--device") + 1] = "auto"
    import torch

    more = max(2, torch.cuda.device_count() + 1)
    done = run_module("trainers.train", *argv, "--gpus", str(more))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: gpus=")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("gpus", "device", "cuda", "problem"),
    [
        (1, "auto", 0, None),
        (2, "cpu", 0, None),  # gloo processes
        (4, "auto", 8, None),
        (8, "cuda", 8, None),
        (2, "auto", 0, "no CUDA device"),
        (9, "auto", 8, "only 8 CUDA device(s)"),
        (2, "mps", 0, "MPS"),
    ],
)
def test_check_gpus(gpus: int, device: str, cuda: int, problem: str | None) -> None:
    from common.errors import BadInputError

    if problem is None:
        check_gpus(gpus, device, cuda)
    else:
        with pytest.raises(BadInputError, match=re.escape(problem)):
            check_gpus(gpus, device, cuda)


@pytest.mark.parametrize(
    ("micro", "accumulation", "cuda", "count"),
    [(4, 8, 8, 8), (4, 5, 8, 5), (2, 3, 4, 3), (1, 1, 8, 0), (4, 8, 1, 0), (8, 1, 8, 8)],
)
def test_a_preset_on_one_of_several_gpus_says_how_many_keep_its_batch(
    micro: int, accumulation: int, cuda: int, count: int
) -> None:
    """A one-GPU preset's run on a host with several says the most `--gpus K` that keeps the
    preset's effective batch, and the per-GPU shape `trainers.preset.on_gpus` then trains."""
    from trainers.preset import on_gpus

    spec = TrainSpec(
        model="m", data="d", micro_batch_size=micro, gradient_accumulation_steps=accumulation
    )
    hint = idle_gpus_hint(spec, cuda, {})
    if not count:  # one GPU, or a batch of 1: nothing to say
        assert hint == ""
        return
    assert f"--gpus {count} trains the preset's effective batch of {micro * accumulation}" in hint
    run = on_gpus(dataclasses.replace(spec, gpus=count), 1, {})
    assert run.micro_batch_size * run.gradient_accumulation_steps * count == micro * accumulation
    assert f"micro-batch {run.micro_batch_size} x accumulation {run.gradient_accumulation_steps}" in hint
    # The user's own count or batch, a CPU run, a preset already on several: nothing.
    for given in ({"gpus": 1}, {"micro_batch_size": micro}, {"gradient_accumulation_steps": 2}):
        assert idle_gpus_hint(spec, cuda, given) == ""
    assert idle_gpus_hint(dataclasses.replace(spec, device="cpu"), cuda, {}) == ""
    assert idle_gpus_hint(dataclasses.replace(spec, gpus=2), cuda, {}) == ""


def test_processes_and_their_count_must_agree() -> None:
    from common.errors import BadInputError

    spec = TrainSpec(model="m", data="d", gpus=2)
    assert processes({}) == Processes(0, 1, 0)
    launched = processes({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert not launched.main and launched.several
    check_processes(spec, launched)
    with pytest.raises(BadInputError, match="launched as 4 process"):
        check_processes(spec, Processes(0, 4, 0))


def test_launch_command_and_exit_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    command = torchrun_command(4, ["--preset", "p.yaml"])
    assert command[1:6] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=4",
        "-m",
    ]
    assert command[-3:] == ["trainers.train", "--preset", "p.yaml"]
    assert report_exit(3) == 3  # not launched: the code as it is
    exit_file = tmp_path / "code"
    monkeypatch.setenv("HPO_TRAIN_EXIT_FILE", str(exit_file))
    monkeypatch.setenv("RANK", "0")
    assert report_exit(3) == 0 and exit_file.read_text() == "3"  # torchrun sees success
    assert report_exit(2) == 2


def test_steps_per_epoch_on_several_processes() -> None:
    # 100 samples at micro-batch 4: 25 micro-batches on one process; 13 on each of two
    # (accelerate pads the last one), 7 optimizer steps at accumulation 2.
    one = TrainSpec(model="m", data="d", micro_batch_size=4, gradient_accumulation_steps=2)
    assert optimizer_steps(one, 100) == 13
    two = TrainSpec(model="m", data="d", micro_batch_size=4, gradient_accumulation_steps=2, gpus=2)
    assert optimizer_steps(two, 100) == 7
    assert two.effective_batch_size == 16


@pytest.mark.parametrize(
    ("micro", "accumulation", "flags", "expected"),
    [
        (4, 8, {"gpus": 4}, (4, 2, 4)),  # the accumulation divided: 32 samples per step
        (4, 2, {"gpus": 8}, (1, 1, 8)),  # the micro-batch divided
        (4, 1, {"gpus": 1}, (4, 1, 1)),
        (4, 2, {"gpus": 4, "gradient_accumulation_steps": 3}, (4, 3, 4)),  # as the user said
    ],
)
def test_a_preset_on_another_gpu_count_keeps_its_effective_batch(
    tmp_path: Path,
    micro: int,
    accumulation: int,
    flags: dict[str, int],
    expected: tuple[int, int, int],
) -> None:
    import yaml

    from trainers.preset import preset_dict
    from trainers.train import load_run

    spec = TrainSpec(
        model="m", data="d", micro_batch_size=micro, gradient_accumulation_steps=accumulation
    )
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump(preset_dict(spec, estimate={}, provenance={})))
    run = load_run(str(preset), dict(flags)).spec
    assert (run.micro_batch_size, run.gradient_accumulation_steps, run.gpus) == expected


def test_a_preset_batch_no_gpu_count_can_keep_is_bad_input(tmp_path: Path) -> None:
    import yaml

    from common.errors import BadInputError
    from trainers.preset import preset_dict
    from trainers.train import load_run

    spec = TrainSpec(model="m", data="d", micro_batch_size=3, gradient_accumulation_steps=1)
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump(preset_dict(spec, estimate={}, provenance={})))
    with pytest.raises(BadInputError, match="effective batch of 3"):
        load_run(str(preset), {"gpus": 2})
