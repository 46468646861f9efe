"""Lease part 3 (~120 s): a real study on the GPU, read back from its Optuna and MLflow stores.

`python -m hpo.study` as a user types it (a few trials, NF4 allowed, system metrics every
2 s) on a ~270 M llama built locally, then, from its stores: every trial in Optuna and once
in MLflow with its state; the time model's error on each trial (`trial_estimate_error_pct`)
and whether it fell in the band; GPU metrics on the trials' runs; and whether memory is
freed between trials (the lowest GPU memory reading of each trial's run stays where the
first trial's was). Then `--workers 2` on one GPU, which must be refused with exit 2
(one trial per GPU: `hpo.workers.gpu_assignment`); on the CPU, where there is no GPU to
refuse, the same function is asked with one GPU id.

    python -m benchmarks.lease.study --out study.json --work DIR [--smoke]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lease.part import first_line, guarded, start  # noqa: E402
from common.cli import run_cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRIALS, SMOKE_TRIALS = 6, 3
# A trial starts with its base and adapter allocated and nothing else: among trials on one
# base, the allocation at the start may differ by the adapters (a rank-64 adapter of the
# study's 270M model and its gradients are under 100 MB) and the allocator's rounding.
# What an earlier trial left behind (a trainer, optimizer moments, activations) is more.
FREED_SLACK_MB = 256.0


def study_argv(work: Path, model: str, data: str, *, smoke: bool, timeout: float) -> list[str]:
    """The command a user would type (sizes cut to fit the part's time)."""
    argv = [
        "--model", model, "--data", data, "--work-dir", str(work / "study"),
        "--study-name", "lease", "--n-trials", str(SMOKE_TRIALS if smoke else TRIALS),
        "--trial-fraction", "0.06" if smoke else "0.05", "--trial-evals", "3",
        "--eval-samples", "16", "--system-metrics-seconds", "2", "--allow-quantization",
        "--reference-fraction", "0", "--seed", "0", "--timeout", str(int(timeout)),
        "--json", str(work / "study" / "summary.json"), "--no-progress",
    ]  # fmt: skip
    if smoke:  # promotions (continued trials) are left to the GPU: seconds count here
        # ... and so is training the data's p99 (~400 tokens): the CPU trains rows of 128.
        argv += ["--profiles", "fast", "--device", "cpu", "--promote", "0", "--max-length", "128"]
    else:
        argv += ["--device", "cuda", "--precision", "bf16"]
    return argv


def run_study(argv: list[str], timeout: float) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "hpo.study", *argv], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout, check=False)  # fmt: skip
    return {"exit_code": proc.returncode, "stderr_tail": proc.stderr[-1500:],
            "stdout_tail": proc.stdout[-800:]}  # fmt: skip


def read_back(work: Path, *, gpu: bool) -> dict[str, Any]:
    """Both stores' view of the study: trials, their runs, time-model errors, system metrics."""
    import json

    import optuna
    from mlflow import MlflowClient

    folder = work / "study"
    summary = json.loads((folder / "summary.json").read_text())
    study = optuna.load_study(study_name="lease", storage=f"sqlite:///{folder / 'optuna.db'}")
    client = MlflowClient(tracking_uri=summary["tracking_uri"])
    runs = client.search_runs(
        [summary["mlflow_experiment_id"]],
        filter_string=f"tags.mlflow.parentRunId = '{summary['mlflow_parent_run_id']}'",
    )
    by_id = {run.info.run_id: run for run in runs}
    memory_key = (
        "system/gpu_0_memory_usage_megabytes" if gpu else "system/system_memory_usage_megabytes"
    )
    trials = []
    for trial in study.trials:
        attrs = trial.user_attrs
        # A promoted trial continues its configuration's run: one MLflow run per configuration.
        run = by_id.get(str(attrs.get("mlflow_run_id")))
        row: dict[str, Any] = {
            "number": trial.number, "state": trial.state.name,
            "quantization": attrs.get("quantization"), "in_mlflow": run is not None,
            "trial_fraction": attrs.get("trial_fraction"),
            "estimate_error_pct": attrs.get("trial_estimate_error_pct"),
            "inside_band": attrs.get("trial_inside_band"),
            "peak_memory_gib": (attrs.get("peak_memory_bytes") or 0) / 2**30,
            # What the allocator held: its ratio to the above is the memory check's own.
            "peak_reserved_gib": (attrs.get("peak_reserved_bytes") or 0) / 2**30,
            "start_memory_mb": (attrs.get("start_memory_bytes") or 0) / 2**20,
            "tokens_per_second": attrs.get("tokens_per_second"),
        }  # fmt: skip
        if run is not None:
            row["system_metrics"] = sorted(k for k in run.data.metrics if k.startswith("system/"))
            history = client.get_metric_history(run.info.run_id, memory_key)
            if history:
                row["memory_low_mb"] = min(m.value for m in history)
                row["memory_high_mb"] = max(m.value for m in history)
        trials.append(row)
    return {
        "states": summary["states"],
        "trials": trials,
        "every_trial_in_mlflow": all(t["in_mlflow"] for t in trials),
        # No run twice, none without a trial: as many child runs as configurations.
        "child_runs": len(runs),
        "one_run_per_configuration": len(runs)
        == len({str(t.user_attrs.get("mlflow_run_id")) for t in study.trials}),
        # A trial pruned before it trained has a run but no system metrics.
        "gpu_metrics_on_every_run": all(
            any(k.startswith("system/gpu") for k in t.get("system_metrics", []))
            for t in trials if t["start_memory_mb"] > 0
        ),  # fmt: skip
        "memory_freed_between_trials": freed(trials) if gpu else None,
        "memory_key": memory_key,
        "quantizations": sorted({str(t["quantization"]) for t in trials}),
    }


def freed(trials: list[dict[str, Any]]) -> bool | None:
    """Whether every trial started with no more allocated than the first on its base did
    (`FREED_SLACK_MB`); None when no trial trained. NVML's readings cannot say it: PyTorch's
    allocator keeps what it freed, and the first reading comes seconds into training."""
    first: dict[str, float] = {}
    ok: bool | None = None
    for trial in trials:
        start = trial["start_memory_mb"]
        if start <= 0:  # never trained
            continue
        base = first.setdefault(str(trial["quantization"]), start)
        ok = (ok is not False) and start <= base + FREED_SLACK_MB
    return ok


def refuse_two_workers(work: Path, model: str, data: str, *, smoke: bool) -> dict[str, Any]:
    """`--workers 2` on one GPU: refused with exit 2 (on the CPU: the rule, asked directly)."""
    if smoke:
        from common.errors import BadInputError
        from hpo.workers import gpu_assignment

        try:
            gpu_assignment(2, ["0"])
        except BadInputError as exc:
            return {"simulated": "no GPU here: gpu_assignment(2, ['0'])", "message": str(exc),
                    "refused": True}  # fmt: skip
        return {"simulated": "no GPU here", "refused": False}
    argv = [*study_argv(work, model, data, smoke=False, timeout=60), "--workers", "2",
            "--storage", f"journal:{work / 'workers.journal'}", "--study-name", "two"]  # fmt: skip
    result = run_study(argv, timeout=120)
    lines = [line for line in result["stderr_tail"].splitlines() if line.strip()]
    return {"exit_code": result["exit_code"], "message": lines[-1] if lines else "",
            "refused": result["exit_code"] == 2 and "one trial per GPU" in result["stderr_tail"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args, record, work = start("study", __doc__, argv)
    from benchmarks._held_out import synthetic_data
    from benchmarks.gpu_check import GPU_DIMS, SMOKE_DIMS, build_model
    model = work / "models" / "study-llama"
    if not (model / "config.json").is_file():
        build_model(model, SMOKE_DIMS if args.smoke else GPU_DIMS)
    data = str(synthetic_data(work / "study-data.jsonl", samples=400 if args.smoke else 3000))
    # The study stops starting trials after --timeout; what is left covers the read-back
    # and the refusal.
    timeout = max(record.left() - 40.0, 20.0)
    try:
        ran = run_study(study_argv(work, str(model), data, smoke=args.smoke, timeout=timeout),
                        timeout=record.left() - 15.0)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        ran = {"error": f"the study ran past {exc.timeout:.0f} s"}
    record.set("study", ran)
    back = guarded(record, "read_back", lambda: read_back(work, gpu=not args.smoke))
    try:
        record.set("two_workers_one_gpu", refuse_two_workers(work, str(model), data,
                                                             smoke=args.smoke))  # fmt: skip
    except Exception as exc:
        record.set("two_workers_one_gpu", {"error": first_line(exc)})
    record.finish(study_status(ran, back))
    return 0


def study_status(ran: dict[str, Any], back: dict[str, Any] | None) -> str:
    """The part's status: "ok" only when the study exited 0 and both stores were read back.

    The part itself ends normally either way (the refusal still runs, the JSON is complete),
    but a study that failed on the GPU is the finding, so the summary's status says so.
    """
    if "error" in ran:
        return "study timed out"
    if ran.get("exit_code") != 0:
        return f"study exit {ran.get('exit_code')}"
    return "ok" if back is not None else "read-back failed"


if __name__ == "__main__":
    sys.exit(run_cli(main))
