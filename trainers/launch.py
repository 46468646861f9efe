"""`trainers.train --gpus N`: start the N processes of a data-parallel run through torchrun.

torchrun (`torch.distributed.run`) starts one process per GPU, gives each its RANK and
WORLD_SIZE and tears them all down when one fails; transformers' Trainer does the rest. This
module only adds what a user of one command expects: the inputs are checked (and the data
tokenized into the cache) once, before any process starts; a SIGTERM reaches the processes
from this command, so they stop at one step with a checkpoint; and the command's exit code
is process 0's (torchrun reports any non-zero worker as a failure, the resumable stop's 3
included), read from a file process 0 writes.

torchrun runs in a session of its own (its processes have theirs). Given a SIGTERM itself,
torchrun passes it on and kills its processes 30 s later (`PContext.close`), whether or not
their step and checkpoint are done; so a SIGTERM to this command (a container's PID 1, a
scheduler's signal to the user's process group) goes to each training process once,
straight from here, and the platform's own grace period is the only limit. A SIGTERM sent
to every process of the machine (a shutdown, a cgroup) still reaches torchrun: 30 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

from common.errors import BadInputError

# Set by the launcher for its processes: where process 0 writes the command's exit code.
EXIT_FILE_ENV = "HPO_TRAIN_EXIT_FILE"
# The launcher's `time.monotonic()` at its start (one clock for every process of a machine):
# the window opens when the user's command starts, not when its processes do.
OPENED_ENV = "HPO_TRAIN_WINDOW_OPENED"


def check_gpus(gpus: int, device: str, cuda_devices: int) -> None:
    """Whether `gpus` processes can run here: one per visible GPU, or CPU processes when asked.

    Args:
        gpus: Processes the run asks for.
        device: The run's `device` setting ("auto", "cpu", "cuda", "mps").
        cuda_devices: `torch.cuda.device_count()`.

    Raises:
        BadInputError: More processes than GPUs, or several on a machine without CUDA without
            `--device cpu`.
    """
    if gpus <= 1 or device == "cpu":
        return  # CPU processes (gloo) need no device each: a test, or a machine without GPUs
    if device == "mps":
        raise BadInputError(f"gpus={gpus} needs CUDA devices; MPS trains on one process")
    if cuda_devices == 0:
        raise BadInputError(
            f"gpus={gpus}, but no CUDA device is visible here (--device cpu trains {gpus} CPU "
            "processes with gloo)"
        )
    if gpus > cuda_devices:
        raise BadInputError(
            f"gpus={gpus}, but only {cuda_devices} CUDA device(s) are visible here "
            "(CUDA_VISIBLE_DEVICES): give --gpus <= that"
        )


def idle_gpus_hint(spec: Any, cuda_devices: int, given: Any) -> str:
    """One line for a preset's run on one GPU of a host with several: the most of them
    `--gpus K` can train the preset's effective batch on (`trainers.preset.on_gpus`); "" where
    the user chose the count or the batch, or there is nothing to say.

    Args:
        spec: The run (`TrainSpec`), its `gpus` the preset's or the flag's.
        cuda_devices: `torch.cuda.device_count()`.
        given: The flags the user gave.
    """
    import dataclasses

    from trainers.preset import on_gpus

    chosen = {"gpus", "micro_batch_size", "gradient_accumulation_steps"} & set(given)
    if spec.gpus != 1 or cuda_devices < 2 or spec.device in ("cpu", "mps") or chosen:
        return ""
    batch = spec.micro_batch_size * spec.gradient_accumulation_steps
    for count in range(cuda_devices, 1, -1):
        try:
            run = on_gpus(dataclasses.replace(spec, gpus=count), 1, {})
        except BadInputError:  # no micro-batch x accumulation on that many makes the batch
            continue
        return (
            f"this host has {cuda_devices} GPUs and this run trains on one: --gpus {count} "
            f"trains the preset's effective batch of {batch} on {count} (micro-batch "
            f"{run.micro_batch_size} x accumulation {run.gradient_accumulation_steps} each)"
        )
    return ""


def torchrun_command(gpus: int, argv: list[str]) -> list[str]:
    """`python -m torch.distributed.run` starting `gpus` processes of `trainers.train argv`.

    `--standalone` runs the rendezvous on this machine on a free port, so two runs side by
    side do not collide.
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={gpus}",
        "-m",
        "trainers.train",
        *argv,
    ]


def launch(gpus: int, argv: list[str], opened_at: float) -> int:
    """Run `trainers.train argv` on `gpus` processes; returns process 0's exit code."""
    with tempfile.TemporaryDirectory(prefix="hpo-train-") as folder:
        exit_file = Path(folder) / "exit_code"
        env = {**os.environ, EXIT_FILE_ENV: str(exit_file), OPENED_ENV: repr(opened_at)}
        child = subprocess.Popen(
            torchrun_command(gpus, argv), env=env, start_new_session=True
        )

        def stop(signum: int, frame: FrameType | None) -> None:
            workers = _training_processes(child.pid)
            for worker in workers:
                worker.send_signal(signum)
            if not workers:  # none started yet: torchrun passes it on to those it starts
                child.send_signal(signum)

        previous = signal.signal(signal.SIGTERM, stop)
        try:
            returncode = child.wait()
        except KeyboardInterrupt:  # Ctrl-C: as it would reach them in one process group
            os.killpg(child.pid, signal.SIGINT)
            returncode = child.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)
        try:
            return int(exit_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return returncode or 1  # process 0 did not get to its end


def _training_processes(torchrun: int) -> list[Any]:
    """torchrun's processes of the run (its children that run trainers.train)."""
    import psutil

    found = []
    try:
        children = psutil.Process(torchrun).children()
    except psutil.Error:
        return []
    for child in children:
        try:
            if "trainers.train" in child.cmdline():
                found.append(child)
        except psutil.Error:
            continue  # ended meanwhile
    return found


def report_exit(code: int) -> int:
    """What a process of a launched run exits with: its code goes to the launcher.

    Process 0 writes `code` for the launcher; every process then exits 0 for a finished or
    resumable run, so torchrun does not take a window stop for a failure.
    """
    path = os.environ.get(EXIT_FILE_ENV)
    if not path:
        return code
    if os.environ.get("RANK", "0") == "0":
        Path(path).write_text(str(code), encoding="utf-8")
    return 0 if code in (0, 3) else code


def window_opened(default: float) -> float:
    """When the user's command started: the launcher's clock reading, else `default`."""
    value = os.environ.get(OPENED_ENV)
    try:
        return float(value) if value else default
    except ValueError:
        return default
