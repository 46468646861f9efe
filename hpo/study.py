"""`python -m hpo.study`: search LoRA configurations that fit the time budget.

With no arguments it runs the embedded demo study (tiny model, bundled data, SQLite for
Optuna and MLflow under ./hpo-runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from common.cli import EXIT_OK, check_writable, check_writable_dir, run_cli
from common.errors import BadInputError, HpoError
from common.files import write_json
from common.flags import FieldFlags, add_field_flags
from common.redact import redact, redact_values
from hpo.config import StudyConfig, load_config, mlflow_defaults


def build_parser() -> tuple[argparse.ArgumentParser, FieldFlags]:
    """The parser: one flag per `StudyConfig` field, plus the command's own flags."""
    parser = argparse.ArgumentParser(
        prog="python -m hpo.study",
        description="Find the best LoRA configuration that fits a time budget (Optuna + MLflow).",
    )
    parser.add_argument("--config", help="Study YAML; flags override its values.")
    flags = add_field_flags(parser, StudyConfig)
    parser.add_argument("--json", help="Write the study's result to this JSON file.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="Local worker processes of this study (one GPU each on a multi-GPU host); "
        "needs a PostgreSQL or journal: storage. Default: 1.",
    )
    return parser, flags


def main(argv: list[str] | None = None) -> int:
    parser, flags = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    config = load_config(args.config, flags.given(args))
    check_writable_dir(config.work_dir, "work_dir")
    if args.json:
        check_writable(args.json)
    _check_tracking_server(config)

    from hpo.runner import run_study

    if args.workers < 1:
        raise BadInputError(f"--workers must be >= 1, but got {args.workers}")
    if args.workers != 1:
        finished = run_workers(config, args.workers, argv)
        # The summary of the whole study, from this process: no trial is added.
        config = dataclasses.replace(config, n_trials=max(1, min(config.n_trials, finished)))
    summary = run_study(config, progress=not args.no_progress and args.workers == 1)
    if args.json:
        write_json(args.json, redact_values(summary.to_dict()))
    _print_summary(summary, mlflow_defaults().get("server") or {})
    return EXIT_OK


def _check_tracking_server(config: StudyConfig) -> None:
    """A tracking server that must answer (`--tracking-outage fail`): asked before any store
    is written, so a refused start leaves no study behind."""
    uri = config.tracking.uri or ""
    if config.tracking.outage != "fail":
        return
    if uri.startswith(("http://", "https://")):
        from hpo.tracking import Tracker

        Tracker(uri, config.tracking.experiment_name or "hpo-lora")  # raises when it does not answer


def run_workers(config: StudyConfig, n_workers: int, argv: list[str]) -> int:
    """Run `n_workers` local worker processes of the study until all have ended.

    Each runs this command (without `--workers` and `--json`, seed + its index), with its own
    GPU on a multi-GPU host; its output goes to `<work_dir>/workers/worker-<i>.log`.

    Returns:
        The study's finished trials.

    Raises:
        BadInputError: A storage workers cannot share (SQLite), more workers than GPUs, bad
            input found before they start, or the first worker's bad-input message.
        HpoError: A worker failed.
    """
    import optuna

    from hpo.prepare import prepare
    from hpo.states import FINISHED_STATES
    from hpo.storage import make_storage, shared_by_processes
    from hpo.workers import gpu_assignment, visible_gpus

    url = config.storage_url
    if not shared_by_processes(url):
        journal = Path(config.work_dir) / "optuna.journal"
        raise BadInputError(
            f"--workers {n_workers} needs a storage several processes can share, not SQLite "
            f"({redact(url)}): use --storage postgresql://USER:PASSWORD@HOST/DB or "
            f"--storage journal:{journal}"
        )
    gpus = gpu_assignment(n_workers, visible_gpus(config.device))
    prepare(config)  # bad model or data: one message, before any worker; tokenized once for all
    # Both stores' tables (and the experiment) are created here once, not raced for.
    make_storage(url, heartbeat_seconds=config.heartbeat_seconds)
    if config.tracking.uri:
        from common.mlflow_writer import TrackingUnreachable
        from hpo.tracking import Tracker

        artifacts = str(Path(config.work_dir) / "mlartifacts")
        try:
            Tracker(
                config.tracking.uri, config.tracking.experiment_name or "hpo-lora", artifact_dir=artifacts
            )
        except TrackingUnreachable:
            if config.tracking.outage != "spool":
                raise
            # Each worker starts offline and keeps its records in its own spool.
    logs = Path(config.work_dir) / "workers"
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for index, gpu in enumerate(gpus):
        env = {**os.environ, "HPO_WORKER_INDEX": str(index)}
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        log_path = logs / f"worker-{index}.log"
        with open(log_path, "w", encoding="utf-8") as log_file:
            command = [sys.executable, "-m", "hpo.study", *_worker_argv(argv, config.seed + index)]
            procs.append(
                subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)
            )
        where = f" on GPU {gpu}" if gpu is not None else ""
        print(f"worker {index}: pid {procs[-1].pid}{where}, output in {log_path}", flush=True)
    _wait_for(procs, logs)
    study = optuna.load_study(study_name=config.study_name, storage=make_storage(url))
    return len(study.get_trials(deepcopy=False, states=FINISHED_STATES))


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


def _wait_for(procs: list[subprocess.Popen[bytes]], logs: Path) -> None:
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
        lines = (logs / f"worker-{index}.log").read_text(encoding="utf-8").strip().splitlines()
        last = lines[-1] if lines else f"exit code {code}"
        if code == 2:
            raise BadInputError(f"worker {index}: {last.removeprefix('error: ')}")
        raise HpoError(f"worker {index} exited with code {code}: {last} (see its log)")


def _print_pareto(summary: Any) -> None:
    """Loss against hours or cost: the configurations no other one beats on both."""
    if not summary.pareto_front:
        return
    second = summary.objectives[1]
    print(f"Pareto front (predicted loss against full-run {second}), cheapest first:")
    for point in summary.pareto_front:
        amount = f"{point[second]:.3g} h" if second == "hours" else f"{point[second]:.2f}"
        print(f"  trial {point['trial']:<4} loss {point['loss']:.4f}  {second} {amount}")
    print("export another: python -m hpo.export --trial N, or --pick cheapest-within PCT")


def _print_summary(summary: Any, server: dict[str, Any]) -> None:
    states = summary.states
    print(
        f"study '{summary.study_name}': {states['complete']} complete, {states['pruned']} pruned, "
        f"{states['failed']} failed in {summary.elapsed_seconds:.0f} s"
    )
    _print_search(getattr(summary, "search", None) or {})
    if summary.best_value is None:
        print("no trial completed: nothing to export")
    else:
        by_prediction = summary.objective == "predicted_full_run_loss" and (
            getattr(summary, "best_scored_by", None) in (None, "prediction")
        )
        what = (
            "its full run's predicted final validation loss, before correction"
            if by_prediction
            else "its validation loss at the trials' share of the data"
        )
        print(f"best trial {summary.best_trial}: score {summary.best_value:.4f} ({what})")
        for key, value in summary.best_params.items():
            shown = f"{value:.3g}" if isinstance(value, float) else value
            print(f"  {key:<28} {shown}")
        _print_estimate(summary.best_estimate)
        _print_pareto(summary)
        print(f"preset: {summary.preset_path}")
        print(f"train it: python -m trainers.train --preset {summary.preset_path}")
        if summary.report_path:
            print(f"report: {summary.report_path} (also on the study's MLflow run, under report/)")
    host, port = server.get("host", "127.0.0.1"), server.get("port", 5000)
    uri = redact(summary.tracking_uri)
    if uri.startswith(("http://", "https://")):
        base = uri.rstrip("/")
    else:
        print("open the MLflow UI:")
        print(
            f"  {Path(sys.executable)} -m mlflow server --backend-store-uri {uri} --host {host} --port {port}"
        )
        base = f"http://{host}:{port}"
    print(
        f"  {base}/#/experiments/{summary.mlflow_experiment_id}/runs?workflowType=machine_learning"
    )
    waiting = getattr(summary, "tracking_records_waiting", 0)
    if waiting:
        print(
            f"{waiting} MLflow records wait for the tracking server in {summary.tracking_spool}; "
            f"send them with: python -m hpo.tracking --replay {summary.tracking_spool}"
        )


def _print_search(search: dict[str, Any]) -> None:
    """The search's plan against what it spent, and which limit ended it."""
    if not search:
        return
    line = (
        f"search: planned {_hm(search['planned_hours'])} GPU time ({search['trials']} trials at "
        f"{search['fidelity']:.3g} of their full run), spent {_hm(search['spent_hours'])}"
    )
    if search.get("budget_hours"):
        line += f" of a {_hm(search['budget_hours'])} budget ({search['source']})"
    if search.get("price_per_hour"):
        line += f"; cost {search['spent_cost']:.2f} spent, {search['planned_cost']:.2f} planned"
    print(f"{line}; ended by {search['ended_by']}")


def _print_estimate(estimate: dict[str, Any]) -> None:
    loss = estimate.get("final_val_loss") or {}
    if {"p10", "p50", "p90"} <= set(loss):
        corrected = (estimate.get("loss_correction") or {}).get("runs", 0)
        source = f"corrected by {corrected} full runs" if corrected else "no full run reported yet"
        method = estimate.get("final_val_loss_method")
        if method:  # joint / own / fallback, and from how many of the trial's points
            source = f"{method}, {estimate.get('final_val_loss_points', '?')} points; {source}"
        print(
            f"full run's final validation loss: {loss['p50']:.4f} predicted "
            f"(p10-p90 {loss['p10']:.4f} to {loss['p90']:.4f}; {source})"
        )
    hours = estimate.get("duration_hours") or {}
    if "p50" not in hours:
        return
    line = f"full run: {_hm(hours['p50'])} predicted"
    if "p10" in hours and "p90" in hours:
        line += f" (p10-p90 {_hm(hours['p10'])} to {_hm(hours['p90'])})"
    if "available_hours" in estimate:
        verdict = "fits" if estimate.get("fits_window") else "does NOT fit"
        line += f"; {verdict} the {_hm(estimate['available_hours'])} available"
    cost = estimate.get("cost") or {}
    if isinstance(cost, dict) and cost.get("p50"):
        line += f"; cost about {cost['p50']:.2f}"
    print(line)


def _hm(hours: float) -> str:
    minutes = hours * 60
    if minutes < 1:
        return f"{minutes * 60:.0f} s"
    if minutes < 90:
        return f"{minutes:.1f} min"
    return f"{hours:.1f} h"


if __name__ == "__main__":
    sys.exit(run_cli(main))
