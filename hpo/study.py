"""`python -m hpo.study`: search LoRA configurations that fit the time budget.

With no arguments it runs the embedded demo study (tiny model, bundled data, SQLite for
Optuna and MLflow under ./hpo-runs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from common.cli import EXIT_OK, check_writable, run_cli
from common.files import write_json

# flag -> (type, help); each maps to the StudyConfig / Budget field of the same name.
_FLAGS: dict[str, tuple[Any, str]] = {
    "model": (str, "local model folder (default: the tiny demo model)"),
    "data": (str, "JSONL data (default: the bundled demo data)"),
    "space": (str, "search-space YAML (default: search_spaces/default.yaml)"),
    "trial_max_steps": (int, "optimizer steps per trial (the fidelity)"),
    "eval_interval": (int, "steps between evaluations in a trial"),
    "eval_samples": (int, "validation samples per evaluation"),
    "epochs": (float, "epochs of the full run the preset describes"),
    "full_eval_interval": (int, "steps between evaluations in the full run"),
    "full_checkpoint_interval": (int, "steps between checkpoints in the full run"),
    "window_hours": (float, "the full run's time window (default 12)"),
    "safety_margin_minutes": (float, "kept free at the end of the window (default 30)"),
    "price_per_hour": (float, "machine price per hour, for the cost estimate"),
    "max_memory_gb": (float, "memory limit (default: the device's memory)"),
    "sampler": (str, "tpe | gp | cmaes | random | skopt"),
    "pruner": (str, "hyperband | successive_halving | median | none"),
    "n_trials": (int, "trials in the study, counted over all runs and workers"),
    "timeout": (float, "seconds this worker may spend"),
    "seed": (int, "random seed"),
    "storage": (str, "Optuna storage URL (default: SQLite in the work dir)"),
    "study_name": (str, "study name (same name + storage = resume)"),
    "heartbeat_seconds": (int, "worker heartbeat on server storages (default 30)"),
    "grace_seconds": (int, "silence after which a worker is taken as dead (default 120)"),
    "work_dir": (str, "where databases, caches and presets go (default ./hpo-runs)"),
    "tracking_uri": (str, "MLflow tracking URI (default from mlflow.yaml)"),
    "experiment_name": (str, "MLflow experiment (default from mlflow.yaml)"),
    "device": (str, "auto | cpu | cuda | mps"),
    "precision": (str, "auto | fp32 | bf16 | fp16"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpo.study",
        description="Find the best LoRA configuration that fits a time budget (Optuna + MLflow).",
    )
    parser.add_argument("--config", help="study YAML; flags override its values")
    for name, (kind, help_text) in _FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, help=help_text)
    parser.add_argument("--profiles", help="comma-separated profiles allowed (default: all)")
    parser.add_argument("--json", help="write the study's result to this JSON file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    from hpo.config import load_config, mlflow_defaults

    args = build_parser().parse_args(argv)
    overrides = {name: getattr(args, name) for name in _FLAGS}
    if args.profiles:
        overrides["profiles"] = [p.strip() for p in args.profiles.split(",") if p.strip()]
    config = load_config(args.config, overrides)
    if args.json:
        check_writable(args.json)

    from hpo.runner import run_study

    summary = run_study(config, progress=not args.no_progress)
    if args.json:
        write_json(args.json, summary.to_dict())
    _print_summary(summary, mlflow_defaults().get("server") or {})
    return EXIT_OK


def _print_summary(summary: Any, server: dict[str, Any]) -> None:
    states = summary.states
    print(
        f"study '{summary.study_name}': {states['complete']} complete, {states['pruned']} pruned, "
        f"{states['failed']} failed in {summary.elapsed_seconds:.0f} s"
    )
    if summary.best_value is None:
        print("no trial completed: nothing to export")
    else:
        print(f"best validation loss {summary.best_value:.4f} (trial {summary.best_trial}):")
        for key, value in summary.best_params.items():
            shown = f"{value:.3g}" if isinstance(value, float) else value
            print(f"  {key:<28} {shown}")
        _print_estimate(summary.best_estimate)
        print(f"preset: {summary.preset_path}")
        print(f"train it: python -m trainers.train --preset {summary.preset_path}")
    host, port = server.get("host", "127.0.0.1"), server.get("port", 5000)
    from hpo.storage import redact

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


def _print_estimate(estimate: dict[str, Any]) -> None:
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
