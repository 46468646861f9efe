"""Local workers of one study on PostgreSQL with a real `mlflow server` over HTTP.

12 trials with 1, 2 and 3 worker processes (each a `python -m hpo.study` on the same study,
which is what `--workers N` starts): wall time, trials per minute, and the exactly-once
check after each (every trial one child run, complete trials with their whole train_loss
history, the parent's counts equal to the storage). Then the same with 3 workers of which
one is SIGKILLed mid-trial (once its trial's MLflow run exists) and the MLflow server killed
and restarted once on the same store while the others go on; what a worker left in its spool
is then sent with `python -m hpo.tracking --replay`, as a user would.

    python benchmarks/parallel_workers.py [--json FILE] [--trials 12] [--smoke]

JSON keys: `speedup_2`, `speedup_3` (wall time of 1 worker / N workers), `lost_records`,
`duplicate_records` (both summed over every phase; both must be 0), `phases`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna
import psycopg
from mlflow import MlflowClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._common import machine, table, write_json  # noqa: E402
from common.spool import spool_folders  # noqa: E402
from hpo.keys import WORKER_ATTR  # noqa: E402
from hpo.states import STATE_NAMES  # noqa: E402
from tests.servers import MlflowServer, postgres_server  # noqa: E402
from trainers.tiny import default_tiny_model  # noqa: E402

FINISHED = tuple(STATE_NAMES)
WORKER_FLAGS = [
    "--trial-fraction", "0.015", "--trial-evals", "2", "--eval-samples", "8",
    "--profiles", "fast", "--pruner", "none", "--rungs", "none",
    "--heartbeat-seconds", "2", "--grace-seconds", "8",
]  # fmt: skip


def database(server_url: str, name: str) -> str:
    """A fresh database on the benchmark's PostgreSQL server."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def start_worker(
    root: Path, index: int, *, model: Path, storage: str, tracking: str, study: str, trials: int
) -> subprocess.Popen[str]:
    work = root / f"worker-{index}"
    work.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "hpo.study", "--no-progress", "--model", str(model),
        "--work-dir", str(work), "--storage", storage, "--tracking-uri", tracking,
        "--study-name", study, "--experiment-name", study, "--n-trials", str(trials),
        "--seed", str(index), *WORKER_FLAGS,
    ]  # fmt: skip
    log = (work / "worker.log").open("w", encoding="utf-8")
    return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)


def exactly_once(study: optuna.Study, client: MlflowClient, experiment: str) -> dict[str, Any]:
    """Compare the study's storage with what the MLflow server holds."""
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"experiment {experiment} missing"
    runs = client.search_runs([found.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("hpo.role") == "study"]
    parent_ids = {p.info.run_id for p in parents}
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") in parent_ids]
    by_trial: dict[int, list[Any]] = {}
    for child in children:
        by_trial.setdefault(int(child.data.tags["hpo.trial_number"]), []).append(child)
    # A trial queued again for a killed worker's may stay WAITING once the study is full.
    trials = study.get_trials(deepcopy=False, states=FINISHED)
    duplicate = max(0, len(parents) - 1)  # one parent run per study
    lost = 0 if parents else 1
    short_histories = 0
    for trial in trials:
        runs_of_trial = by_trial.get(trial.number, [])
        if not runs_of_trial:
            lost += 1
        duplicate += max(0, len(runs_of_trial) - 1)
        if trial.state == optuna.trial.TrialState.COMPLETE and runs_of_trial:
            steps = [
                m.step
                for m in client.get_metric_history(runs_of_trial[0].info.run_id, "train_loss")
            ]
            expected = list(range(1, int(trial.user_attrs["trained_steps"]) + 1))
            duplicate += len(steps) - len(set(steps))
            if sorted(set(steps)) != expected:
                short_histories += 1
    counts_equal = False
    if parents:
        metrics = client.get_run(parents[0].info.run_id).data.metrics
        stored = {k.removeprefix("n_"): int(v) for k, v in metrics.items() if k.startswith("n_")}
        states = [STATE_NAMES[t.state] for t in trials if t.state in STATE_NAMES]
        counts_equal = stored == {k: states.count(k) for k in stored}
    still_open = sum(1 for c in children if c.info.status == "RUNNING")
    return {
        "finished": len(trials),
        "left_running": len(
            study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        ),
        "child_runs": len(children),
        "parent_runs": len(parents),
        "lost_records": lost + short_histories,
        "duplicate_records": duplicate,
        "parent_counts_equal_storage": counts_equal,
        "runs_left_running": still_open,
    }


def run_phase(
    name: str,
    workers: int,
    *,
    root: Path,
    model: Path,
    postgres: str,
    server: MlflowServer,
    trials: int,
    outage: bool = False,
) -> dict[str, Any]:
    """One study of `trials` trials by `workers` local workers; checked afterwards."""
    storage = database(postgres, f"optuna_{name}")
    study_name = f"bench_{name}"
    folder = root / name
    started = time.perf_counter()
    procs = [
        start_worker(
            folder, i, model=model, storage=storage, tracking=server.url, study=study_name,
            trials=trials,
        )
        for i in range(workers)
    ]  # fmt: skip
    events: dict[str, float] = {}
    if outage:
        events = kill_one_and_restart_server(procs[0], storage, study_name, server, started)
    codes = [p.wait(timeout=3600) for p in procs]
    wall = time.perf_counter() - started
    survivors = [c for i, c in enumerate(codes) if not (outage and i == 0)]
    if any(survivors):
        logs = [(folder / f"worker-{i}" / "worker.log").read_text()[-3000:] for i in range(workers)]
        raise RuntimeError(f"{name}: a worker failed: {codes}\n" + "\n---\n".join(logs))
    sent_later = replay_left_spools(folder, server.url)
    study = optuna.load_study(study_name=study_name, storage=storage)
    check = exactly_once(study, MlflowClient(server.url), study_name)
    reopened = check["runs_left_running"]
    if reopened:  # the server was away when the last worker ended: the next start closes them
        again = start_worker(
            folder, workers, model=model, storage=storage, tracking=server.url,
            study=study_name, trials=trials,
        )  # fmt: skip
        again.wait(timeout=600)
        check = exactly_once(study, MlflowClient(server.url), study_name)
    check["runs_closed_by_a_later_start"] = reopened - check["runs_left_running"]
    waiting = sum(_waiting(p) for p in spool_folders_under(folder))
    check["lost_records"] += waiting
    finished = check["finished"]
    spooled = sum(_spooled(folder / f"worker-{i}" / "worker.log") for i in range(workers))
    return {
        "phase": name,
        "workers": workers,
        "wall_seconds": wall,
        "trials_per_minute": 60 * finished / wall,
        "records_spooled": spooled,
        "records_replayed_after": sent_later,
        "records_waiting": waiting,
        **check,
        **events,
    }


def kill_one_and_restart_server(
    victim: subprocess.Popen[str],
    storage: str,
    study_name: str,
    server: MlflowServer,
    started: float,
) -> dict[str, float]:
    """SIGKILL `victim` mid-trial once its trial's MLflow run exists; then an MLflow outage."""
    client = MlflowClient(server.url)
    while True:
        trial = _running_trial_of(victim.pid, storage, study_name)
        if trial is not None and _has_run(client, study_name, trial):
            break
        if victim.poll() is not None:
            raise RuntimeError("the worker to kill ended before it ran a trial")
        time.sleep(0.3)
    victim.send_signal(signal.SIGKILL)
    killed_at = time.perf_counter() - started
    server.stop(kill=True)
    time.sleep(2)  # the other workers train on and spool what the server does not take
    server.start()  # (which takes seconds more)
    return {
        "worker_killed_at_s": killed_at,
        "server_down_s": time.perf_counter() - started - killed_at,
        "killed_trial": float(trial),
    }


def _running_trial_of(pid: int, storage: str, study_name: str) -> int | None:
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return None
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = trial.user_attrs.get(WORKER_ATTR) or {}
        if isinstance(worker, dict) and worker.get("pid") == pid:
            return trial.number
    return None


def _has_run(client: MlflowClient, study_name: str, number: int) -> bool:
    experiment = client.get_experiment_by_name(study_name)
    if experiment is None:
        return False
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`hpo.trial_number` = '{number}' and tags.`hpo.study_name` = '{study_name}'",
    )
    return bool(runs)


def replay_left_spools(folder: Path, url: str) -> int:
    """What a worker (the killed one, say) left waiting, sent as a user would."""
    sent = 0
    for spool in spool_folders_under(folder):
        done = subprocess.run(
            [sys.executable, "-m", "hpo.tracking", "--replay", str(spool), "--tracking-uri", url],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        for line in done.stdout.splitlines():
            if line.startswith("sent "):
                sent += int(line.split()[1])
    return sent


def spool_folders_under(folder: Path) -> list[Path]:
    return [
        p for work in sorted(folder.glob("worker-*")) for p in spool_folders(work / "mlflow-spool")
    ]


def _waiting(spool: Path) -> int:
    records = (
        (spool / "records.jsonl").read_text().count("\n")
        if (spool / "records.jsonl").exists()
        else 0
    )
    sent = int((spool / "sent").read_text().strip() or 0) if (spool / "sent").exists() else 0
    return records - sent


def _spooled(log: Path) -> int:
    """Records a worker logged as sent from its spool once the server answered again."""
    total = 0
    for line in log.read_text(errors="replace").splitlines():
        if "answers again:" in line and "spooled records sent" in line:
            total += int(line.split("answers again:")[1].split()[0])
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="Write the results to this JSON file.")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the kill phase alone, 3 trials by 2 workers: the suite runs it",
    )
    args = parser.parse_args(argv)
    # The kill phase runs what the others do, and the kill, the outage and the replay.
    counts: tuple[int, ...] = () if args.smoke else (1, 2, 3)
    if args.smoke:
        args.trials = 3
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = default_tiny_model()
    phases = []
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hpo-workers-")))
        postgres = stack.enter_context(postgres_server(root))
        (root / "mlflow").mkdir()
        server = MlflowServer(root / "mlflow")
        server.start()
        stack.callback(server.stop, kill=True)
        for workers in counts:
            phases.append(
                run_phase(f"w{workers}", workers, root=root, model=model, postgres=postgres,
                          server=server, trials=args.trials)
            )  # fmt: skip
            print(f"{workers} worker(s): {phases[-1]['wall_seconds']:.0f} s", flush=True)
        phases.append(  # one worker is killed: at least one other must go on
            run_phase("kill", max(counts, default=2), root=root, model=model, postgres=postgres,
                      server=server, trials=args.trials, outage=True)
        )  # fmt: skip
    base = phases[0]["wall_seconds"]
    result = {
        "machine": machine(),
        "trials": args.trials,
        **{
            f"speedup_{n}": base / p["wall_seconds"]
            for n, p in zip(counts[1:], phases[1 : len(counts)], strict=True)
        },
        "lost_records": sum(p["lost_records"] for p in phases),
        "duplicate_records": sum(p["duplicate_records"] for p in phases),
        "phases": phases,
    }
    headers = ["phase", "workers", "wall s", "trials/min", "finished", "child runs",
               "lost", "dup", "counts=storage", "spooled->sent"]  # fmt: skip
    rows = [
        [p["phase"], p["workers"], p["wall_seconds"], p["trials_per_minute"], p["finished"],
         p["child_runs"], p["lost_records"], p["duplicate_records"],
         p["parent_counts_equal_storage"], p["records_spooled"] + p["records_replayed_after"]]
        for p in phases
    ]  # fmt: skip
    print(table(headers, rows))
    speedups = [f"{n} workers {result[f'speedup_{n}']:.2f}x" for n in counts[1:]]
    if speedups:
        print("speed-up: " + ", ".join(speedups))
    write_json(args.json, result)
    return 0 if result["lost_records"] == 0 and result["duplicate_records"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
