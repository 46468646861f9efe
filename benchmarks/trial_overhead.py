"""Where a trial's time goes, with the base model kept between trials and without.

The same study (`python -m hpo.study`, same seed, so the same configurations and, since
reuse changes nothing but time, the same losses) runs twice per model size in one
invocation: `--reuse-base-model` (the default: one base model, tokenizer and tokenized data
per worker, LoRA adapters swapped) and `--no-reuse-base-model` (everything loaded for
every trial). Per trained trial, from its Optuna record: wall time (start to end of the
trial), time in optimizer steps (their data loading included), time in evaluations, and
everything else: the overhead (loading, building the Trainer, the timed checkpoint save,
the time model and the final-loss fit, tracking). The first trial is reported apart: it
loads what the others reuse.

Sizes: the tiny llama `s` (the bundled data) and `m` (~99 M parameters; a subset of the
data, fewer and smaller evaluations, so that its 20 trials take minutes on a CPU).

    python benchmarks/trial_overhead.py [--json FILE] [--trials 10] [--sizes s,m]
        [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import machine, median, table, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODES = {"reuse": "--reuse-base-model", "fresh": "--no-reuse-base-model"}
# Study flags per size: the bundled data for `s`; for `m` (~99 M parameters on a CPU) a
# subset, shorter trials and smaller evaluations.
SIZE_FLAGS = {
    "s": [],
    "m": ["--trial-evals", "2", "--eval-samples", "16", "--trial-fraction", "0.1"],
}
SIZE_RECORDS = {"s": None, "m": 1200}


def trial_rows(storage: str, study_name: str) -> list[dict[str, Any]]:
    """One row per trained trial of the study: wall, steps, evaluation, overhead."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=storage)
    rows = []
    for trial in sorted(study.trials, key=lambda t: t.number):
        attrs = trial.user_attrs
        if attrs.get("never_trained") or "steps_seconds" not in attrs:
            continue  # judged infeasible before training, or failed before measuring
        if trial.datetime_start is None or trial.datetime_complete is None:
            continue
        wall = (trial.datetime_complete - trial.datetime_start).total_seconds()
        steps, evals = float(attrs["steps_seconds"]), float(attrs["eval_seconds"])
        rows.append(
            {
                "trial": trial.number,
                "state": trial.state.name,
                "value": trial.value if trial.values is None or len(trial.values) == 1 else None,
                "params": trial.params,
                "wall_s": wall,
                "steps_s": steps,
                "eval_s": evals,
                "overhead_s": wall - steps - evals,
                "overhead_share": (wall - steps - evals) / wall if wall > 0 else float("nan"),
            }
        )
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The first trained trial apart, the median shares of the others, the totals."""
    if not rows:
        return {"trained_trials": 0}
    rest = rows[1:]
    return {
        "trained_trials": len(rows),
        "first_wall_s": rows[0]["wall_s"],
        "first_overhead_s": rows[0]["overhead_s"],
        "overhead_share": median([r["overhead_share"] for r in rest]),
        "overhead_s": median([r["overhead_s"] for r in rest]),
        "steps_share": median([r["steps_s"] / r["wall_s"] for r in rest]),
        "eval_share": median([r["eval_s"] / r["wall_s"] for r in rest]),
        "total_trial_wall_s": sum(r["wall_s"] for r in rows),
    }


def _data_subset(records: int | None, out: Path) -> str:
    from trainers.data.paths import demo_data_path

    source = demo_data_path("prompt_completion")
    if records is None:
        return str(source)
    lines = Path(source).read_text(encoding="utf-8").splitlines()[:records]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(out)


def run_study(
    size: str, mode: str, model: str, data: str, trials: int, work: Path
) -> dict[str, Any]:
    """One study in its own process; its rows and its process wall time."""
    storage = f"sqlite:///{work / 'optuna.db'}"
    command = [
        sys.executable,
        "-m",
        "hpo.study",
        "--model",
        model,
        "--data",
        data,
        "--n-trials",
        str(trials),
        "--work-dir",
        str(work),
        "--storage",
        storage,
        "--study-name",
        f"overhead-{size}",
        "--no-progress",
        MODES[mode],
        *SIZE_FLAGS[size],
    ]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"study {size}/{mode} failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"rows": trial_rows(storage, f"overhead-{size}"), "process_s": seconds}


def _same_results(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """The same trials with the same configurations and values (to 1e-5)."""
    if [r["trial"] for r in a] != [r["trial"] for r in b]:
        return False
    for x, y in zip(a, b, strict=True):
        if x["params"] != y["params"] or x["state"] != y["state"]:
            return False
        if (x["value"] is None) != (y["value"] is None):
            return False
        if x["value"] is not None and abs(x["value"] - y["value"]) > 1e-5:
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--sizes", default="s,m")
    parser.add_argument("--repeats", type=int, default=1, help="pairs per size, order alternating")
    args = parser.parse_args()

    from trainers.tiny import default_tiny_model

    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    results: dict[str, Any] = {"machine": machine(), "trials": args.trials, "sizes": {}}
    rows_out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="trial-overhead-") as tmp:
        root = Path(tmp)
        for size in sizes:
            model = str(default_tiny_model(arch="llama", size=size))
            data = _data_subset(SIZE_RECORDS.get(size), root / f"data-{size}.jsonl")
            runs: dict[str, list[dict[str, Any]]] = {"reuse": [], "fresh": []}
            for repeat in range(args.repeats):
                order = ["reuse", "fresh"] if repeat % 2 == 0 else ["fresh", "reuse"]
                for mode in order:
                    print(f"size {size}, {mode}, repeat {repeat + 1} ...", flush=True)
                    work = root / f"{size}-{mode}-{repeat}"
                    run = run_study(size, mode, model, data, args.trials, work)
                    run["summary"] = summarize(run["rows"])
                    runs[mode].append(run)
                    for row in run["rows"]:
                        rows_out.append({"size": size, "mode": mode, "repeat": repeat, **row})
            results["sizes"][size] = _size_result(runs)
    results["overhead_share"] = {s: r["overhead_share"] for s, r in results["sizes"].items()}
    results["overhead_share_without_reuse"] = {
        s: r["overhead_share_without_reuse"] for s, r in results["sizes"].items()
    }
    results["speedup"] = {s: r["speedup"] for s, r in results["sizes"].items()}
    results["rows"] = rows_out
    _print(results)
    write_json(args.json, results)


def _size_result(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    reuse = [r["summary"] for r in runs["reuse"]]
    fresh = [r["summary"] for r in runs["fresh"]]

    def med(summaries: list[dict[str, Any]], key: str) -> float:
        return statistics.median(s[key] for s in summaries if key in s)

    return {
        "overhead_share": med(reuse, "overhead_share"),
        "overhead_share_without_reuse": med(fresh, "overhead_share"),
        "overhead_s": med(reuse, "overhead_s"),
        "overhead_s_without_reuse": med(fresh, "overhead_s"),
        "first_wall_s": med(reuse, "first_wall_s"),
        "first_wall_s_without_reuse": med(fresh, "first_wall_s"),
        "total_trial_wall_s": med(reuse, "total_trial_wall_s"),
        "total_trial_wall_s_without_reuse": med(fresh, "total_trial_wall_s"),
        # Sum of the trials' wall times, without reuse / with: the search's own time.
        "speedup": med(fresh, "total_trial_wall_s") / med(reuse, "total_trial_wall_s"),
        "process_speedup": statistics.median(r["process_s"] for r in runs["fresh"])
        / statistics.median(r["process_s"] for r in runs["reuse"]),
        "same_results": all(
            _same_results(a["rows"], b["rows"])
            for a, b in zip(runs["reuse"], runs["fresh"], strict=True)
        ),
        "summaries": {"reuse": reuse, "fresh": fresh},
    }


def _print(results: dict[str, Any]) -> None:
    headers = [
        "size",
        "mode",
        "trained",
        "1st trial s",
        "1st overhead s",
        "overhead s (2+)",
        "overhead share (2+)",
        "steps share",
        "eval share",
        "trials total s",
    ]
    rows = []
    for size, result in results["sizes"].items():
        for mode in ("reuse", "fresh"):
            for s in result["summaries"][mode]:
                rows.append(
                    [
                        size,
                        mode,
                        s.get("trained_trials", 0),
                        s.get("first_wall_s", float("nan")),
                        s.get("first_overhead_s", float("nan")),
                        s.get("overhead_s", float("nan")),
                        f"{100 * s.get('overhead_share', float('nan')):.1f} %",
                        f"{100 * s.get('steps_share', float('nan')):.1f} %",
                        f"{100 * s.get('eval_share', float('nan')):.1f} %",
                        s.get("total_trial_wall_s", float("nan")),
                    ]
                )
    print(table(headers, rows))
    for size, result in results["sizes"].items():
        print(
            f"{size}: speedup {result['speedup']:.2f}x over the trials "
            f"({result['process_speedup']:.2f}x per study process), "
            f"same configurations and values: {result['same_results']}"
        )
    print(json.dumps({k: results[k] for k in ("overhead_share", "speedup")}))


if __name__ == "__main__":
    main()
