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
    return parser, flags


def main(argv: list[str] | None = None) -> int:
    parser, flags = build_parser()
    args = parser.parse_args(argv)
    config = load_config(args.config, flags.given(args))
    if args.json:
        check_writable(args.json)

    from hpo.runner import run_study

    summary = run_study(config, progress=not args.no_progress)
    if args.json:
        write_json(args.json, redact_values(summary.to_dict()))
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
        what = (
            "its full run's predicted final validation loss, before correction"
            if summary.objective == "predicted_full_run_loss"
            else "its validation loss at the trials' fidelity"
        )
        print(f"best trial {summary.best_trial}: score {summary.best_value:.4f} ({what})")
        for key, value in summary.best_params.items():
            shown = f"{value:.3g}" if isinstance(value, float) else value
            print(f"  {key:<28} {shown}")
        _print_estimate(summary.best_estimate)
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


def _print_estimate(estimate: dict[str, Any]) -> None:
    loss = estimate.get("final_val_loss") or {}
    if {"p10", "p50", "p90"} <= set(loss):
        corrected = (estimate.get("loss_correction") or {}).get("runs", 0)
        source = f"corrected by {corrected} full runs" if corrected else "no full run reported yet"
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
