"""Workers of one study: the local ones `--workers` starts, who runs a trial, which GPU a
local worker gets, and dead workers.

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
import subprocess
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import optuna
import psutil

from common.errors import BadInputError, HpoError
from common.redact import redact
from common.workdir import WorkDir
from hpo.keys import STATE_REASON_ATTR, WORKER_ATTR

if TYPE_CHECKING:
    from hpo.config import StudyConfig

log = logging.getLogger(__name__)

WORKER_INDEX_ENV = "HPO_WORKER_INDEX"  # set in each worker `--workers N` starts
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
            storage.set_trial_user_attr(trial._trial_id, STATE_REASON_ATTR, reason)
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


def idle_gpus_hint(gpus: Sequence[str], n_workers: int, storage_url: str, journal: str) -> str:
    """One line for a study about to train one trial at a time on a host with several GPUs
    (the rest stay idle, and no flag said so); "" where there is nothing to say.

    Args:
        gpus: The GPU ids the study may use (`visible_gpus`).
        n_workers: `--workers`.
        storage_url: The study's storage.
        journal: The work dir's journal file, the storage to suggest over SQLite.
    """
    if n_workers != 1 or len(gpus) < 2 or os.environ.get(WORKER_INDEX_ENV) is not None:
        return ""
    from hpo.storage import shared_by_processes

    n = len(gpus)
    storage, after = "", ""
    if not shared_by_processes(storage_url):  # SQLite: the workers need another storage
        storage = f" --storage journal:{journal}"
        after = " (a storage of its own: what this study ran stays in SQLite)"
    return (
        f"this host has {n} GPUs ({','.join(gpus)}); the study trains one trial at a time, "
        f"on GPU {gpus[0]}: --workers {n}{storage} trains {n} at once, one per GPU{after}"
    )


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


def run_workers(config: StudyConfig, n_workers: int, argv: list[str]) -> int:
    """Run `n_workers` local worker processes of the study until all have ended.

    Each runs `python -m hpo.study` with `argv` (without `--workers` and `--json`, seed + its
    index), with its own GPU on a multi-GPU host; its output goes to
    `<work_dir>/workers/worker-<i>.log`.

    Returns:
        The study's finished trials.

    Raises:
        BadInputError: A storage workers cannot share (SQLite), more workers than GPUs, bad
            input found before they start, or the first worker's bad-input message.
        HpoError: A worker failed.
    """
    from hpo.prepare import prepare
    from hpo.states import FINISHED_STATES
    from hpo.storage import make_storage, shared_by_processes

    url, work = config.storage_url, WorkDir(config.work_dir)
    if not shared_by_processes(url):
        raise BadInputError(
            f"--workers {n_workers} needs a storage several processes can share, not SQLite "
            f"({redact(url)}): use --storage postgresql://USER:PASSWORD@HOST/DB or "
            f"--storage journal:{work.journal}"
        )
    gpus = gpu_assignment(n_workers, visible_gpus(config.device))
    prepare(config)  # bad model or data: one message, before any worker; tokenized once for all
    # Both stores' tables (and the experiment) are created here once, not raced for.
    make_storage(url, heartbeat_seconds=config.heartbeat_seconds)
    _create_experiment(config)
    work.workers.mkdir(parents=True, exist_ok=True)
    from hpo.search_budget import WORKERS_ENV

    os.environ[WORKERS_ENV] = str(n_workers)  # they share one budget: each plans with it
    procs = []
    for index, gpu in enumerate(gpus):
        env = {**os.environ, WORKER_INDEX_ENV: str(index)}
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        log_path = work.worker_log(index)
        with open(log_path, "w", encoding="utf-8") as log_file:
            command = [sys.executable, "-m", "hpo.study", *_worker_argv(argv, config.seed + index)]
            procs.append(
                subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)
            )
        where = f" on GPU {gpu}" if gpu is not None else ""
        print(f"worker {index}: pid {procs[-1].pid}{where}, output in {log_path}", flush=True)
    _wait_for(procs, work)
    study = optuna.load_study(study_name=config.study_name, storage=make_storage(url))
    return len(study.get_trials(deepcopy=False, states=FINISHED_STATES))


def _create_experiment(config: StudyConfig) -> None:
    """The study's MLflow experiment, created once before the workers start."""
    if not config.tracking.uri:
        return
    from common.outage import TrackingUnreachable
    from hpo.tracking import Tracker

    try:
        Tracker.for_study(config, spool=False)
    except TrackingUnreachable:
        if config.tracking.outage != "spool":
            raise
        # Each worker starts offline and keeps its records in its own spool.


def _worker_argv(argv: list[str], seed: int) -> list[str]:
    """This command's arguments for one worker: no --workers, no --json, its own seed."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--workers", "--json"):
            skip = True
        elif not arg.startswith(("--workers=", "--json=")):
            out.append(arg)
    # Workers with one seed would sample the same configurations.
    return [*out, "--no-progress", "--seed", str(seed)]


def _wait_for(procs: list[subprocess.Popen[bytes]], work: WorkDir) -> None:
    """Wait for every worker; on Ctrl-C stop them all. Raise the first worker's failure."""
    try:
        codes = [proc.wait() for proc in procs]
    except KeyboardInterrupt:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
        raise
    for index, code in enumerate(codes):
        if code == 0:
            continue
        lines = work.worker_log(index).read_text(encoding="utf-8").strip().splitlines()
        last = lines[-1] if lines else f"exit code {code}"
        if code == 2:
            raise BadInputError(f"worker {index}: {last.removeprefix('error: ')}")
        raise HpoError(f"worker {index} exited with code {code}: {last} (see its log)")
