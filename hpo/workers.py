"""Workers of one study: who runs a trial, which GPU a local worker gets, and dead workers.

`--workers N` starts N local worker processes of one study (the same command on several
machines is the real scale-out). Each trial records the worker that runs it (host, process
id and start time); storages without heartbeats (SQLite, journal) then let a starting worker
fail the RUNNING trials of workers that are provably gone, which nothing else would.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import optuna
import psutil

from common.errors import BadInputError

log = logging.getLogger(__name__)

WORKER_ATTR = "hpo_worker"  # trial user attribute: the WorkerId that runs it
# A dead worker's trial is queued again, like the heartbeat path does (Optuna's callback).
MAX_RETRY = 2


@dataclass(frozen=True)
class WorkerId:
    """One worker process, told apart from a later process that reuses its id.

    Attributes:
        host: The host name.
        pid_namespace: The Linux pid namespace ("" elsewhere): containers sharing a host
            name but not their process ids cannot judge each other.
        pid: The process id.
        started: The process's start time (seconds since the epoch).
    """

    host: str
    pid_namespace: str
    pid: int
    started: float

    @classmethod
    def this_process(cls) -> WorkerId:
        return cls(
            socket.gethostname(), _pid_namespace(), os.getpid(), psutil.Process().create_time()
        )

    @classmethod
    def from_attr(cls, value: Any) -> WorkerId | None:
        """The worker a trial recorded, or None when it recorded none (or another shape)."""
        try:
            return cls(
                str(value["host"]),
                str(value["pid_namespace"]),
                int(value["pid"]),
                float(value["started"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def is_gone(self, here: WorkerId) -> bool:
        """True only when this process provably no longer runs (judged from `here`).

        A worker on another host or in another pid namespace is never judged gone.
        """
        if (self.host, self.pid_namespace) != (here.host, here.pid_namespace):
            return False
        try:
            process = psutil.Process(self.pid)
            return (
                abs(process.create_time() - self.started) > 0.01
                or process.status() == psutil.STATUS_ZOMBIE
            )
        except psutil.NoSuchProcess:
            return True
        except psutil.AccessDenied:  # alive, someone else's
            return False


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def claimed(objective: Callable[[optuna.Trial], Any]) -> Callable[[optuna.Trial], Any]:
    """`objective`, recording this worker on each trial before it runs."""
    worker = asdict(WorkerId.this_process())

    def run(trial: optuna.Trial) -> Any:
        trial.set_user_attr(WORKER_ATTR, worker)
        return objective(trial)

    return run


def fail_dead_workers_trials(study: optuna.Study) -> list[int]:
    """Fail the RUNNING trials of workers that are provably gone; queue each again.

    For storages without heartbeats (SQLite, journal), where a killed worker's trial would
    stay RUNNING for ever. A trial of a live worker, of another host, or without a recorded
    worker is left alone.

    Returns:
        The numbers of the trials failed now.
    """
    here = WorkerId.this_process()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)
    failed: list[int] = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = WorkerId.from_attr(trial.user_attrs.get(WORKER_ATTR))
        if worker is None or not worker.is_gone(here):
            continue
        reason = f"its worker (pid {worker.pid} on {worker.host}) died"
        storage = study._storage  # Optuna's public API cannot finish another worker's trial
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            storage.set_trial_user_attr(trial._trial_id, "state_reason", reason)
            storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
            retry(study, storage.get_trial(trial._trial_id))
            failed.append(trial.number)
    if failed:
        log.warning("failed trial(s) %s of dead workers; queued again", failed)
    return failed


def gpu_assignment(n_workers: int, gpus: Sequence[str]) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each of `n_workers` local workers: one GPU each.

    Args:
        n_workers: Worker processes to start.
        gpus: The GPU ids this host lets the study use (CUDA_VISIBLE_DEVICES's entries, or
            0..count-1); empty on a machine without CUDA (or with ``--device cpu``).

    Returns:
        One entry per worker: the GPU id it sees, or None (leave the environment alone).

    Raises:
        BadInputError: More workers than GPUs (one trial per GPU).
    """
    if n_workers < 1:
        raise BadInputError(f"workers must be >= 1, but got workers={n_workers}")
    if not gpus:
        return [None] * n_workers
    if n_workers > len(gpus):
        raise BadInputError(
            f"--workers {n_workers} but {len(gpus)} GPU(s) ({','.join(gpus)}): one trial per "
            f"GPU; use --workers {len(gpus)} or fewer"
        )
    return [str(gpu) for gpu in gpus[:n_workers]]


def visible_gpus(device: str) -> list[str]:
    """The GPU ids local workers may take: none for ``--device cpu`` or without CUDA."""
    if device in ("cpu", "mps"):
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [part.strip() for part in listed.split(",") if part.strip()]
    return [str(index) for index in range(torch.cuda.device_count())]
