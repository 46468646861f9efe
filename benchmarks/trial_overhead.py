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

Work moved out of a trial (between trials) would still cost the user wall time, so each
trial is also measured from its start to the next trial's start: that gap minus its steps
and evaluations is the overhead between starts (trials 2 to n-1).

`--baseline DIR` measures another checkout of the project side by side (e.g. the commit
before a change, from `git worktree add DIR COMMIT`): every study runs in both trees, in
pairs, the order alternating, and the table says which tree each row is from; the trials'
configurations and values are compared between the trees too. The load average before and
after each study is printed with it (the machine is shared).

    python benchmarks/trial_overhead.py [--json FILE] [--trials 10] [--sizes s,m]
        [--repeats 1] [--modes reuse,fresh] [--baseline DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
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
    "xs": ["--trial-evals", "2", "--eval-samples", "8", "--trial-fraction", "0.015",
           "--profiles", "fast", "--rungs", "none"],  # --smoke's: seconds a study
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
    ordered = sorted(study.trials, key=lambda t: t.number)
    starts = [t.datetime_start for t in ordered]
    for index, trial in enumerate(ordered):
        attrs = trial.user_attrs
        if attrs.get("never_trained") or "steps_seconds" not in attrs:
            continue  # judged infeasible before training, or failed before measuring
        if trial.datetime_start is None or trial.datetime_complete is None:
            continue
        wall = (trial.datetime_complete - trial.datetime_start).total_seconds()
        steps, evals = float(attrs["steps_seconds"]), float(attrs["eval_seconds"])
        after = starts[index + 1] if index + 1 < len(starts) else None
        # To the next trial's start: what happens between trials counts too.
        gap = (after - trial.datetime_start).total_seconds() if after else float("nan")
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
                "start_gap_s": gap,
                "gap_overhead_s": gap - steps - evals,
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
        "gap_overhead_s": median(
            [r["gap_overhead_s"] for r in rest if r["start_gap_s"] == r["start_gap_s"]]
        ),
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
    size: str, mode: str, model: str, data: str, trials: int, work: Path, tree: Path = ROOT
) -> dict[str, Any]:
    """One study in its own process, with the code of `tree`; its rows, its process wall time
    and the load average (1 min) before and after it."""
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
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    # `-m` puts the working directory first on the path: the study runs `tree`'s code.
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"study {size}/{mode} failed ({done.returncode}): {done.stderr[-2000:]}")
    return {
        "rows": trial_rows(storage, f"overhead-{size}"),
        "process_s": seconds,
        "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--sizes", default="s,m")
    parser.add_argument("--repeats", type=int, default=1, help="pairs per size, order alternating")
    parser.add_argument("--modes", default="reuse,fresh", help="reuse, fresh or both")
    parser.add_argument("--baseline", help="another checkout of the project, run side by side")
    parser.add_argument(
        "--smoke", action="store_true", help="3 short trials of xs, both modes: the suite runs it"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.trials, args.repeats = "xs", 3, 1

    from trainers.tiny import default_tiny_model

    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(modes) <= set(MODES) or not modes:
        raise SystemExit(f"--modes: reuse and/or fresh, but got {args.modes!r}")
    trees = {"this": ROOT}
    if args.baseline:
        baseline = Path(args.baseline).resolve()
        if not (baseline / "hpo" / "study.py").is_file():
            raise SystemExit(f"--baseline: no checkout of the project in {baseline}")
        trees = {"baseline": baseline, "this": ROOT}
    results: dict[str, Any] = {"machine": machine(), "trials": args.trials, "sizes": {}}
    rows_out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="trial-overhead-") as tmp:
        root = Path(tmp)
        for size in sizes:
            model = str(default_tiny_model(arch="llama", size=size))
            data = _data_subset(SIZE_RECORDS.get(size), root / f"data-{size}.jsonl")
            runs: dict[str, dict[str, list[dict[str, Any]]]] = {
                tree: {mode: [] for mode in modes} for tree in trees
            }
            pairs = [(tree, mode) for mode in modes for tree in trees]
            for repeat in range(args.repeats):
                for tree, mode in pairs if repeat % 2 == 0 else pairs[::-1]:
                    print(f"size {size}, {tree}, {mode}, repeat {repeat + 1} ...", flush=True)
                    work = root / f"{size}-{tree}-{mode}-{repeat}"
                    run = run_study(size, mode, model, data, args.trials, work, trees[tree])
                    run["summary"] = {**summarize(run["rows"]), "load": run["load"]}
                    runs[tree][mode].append(run)
                    for row in run["rows"]:
                        rows_out.append(
                            {"size": size, "tree": tree, "mode": mode, "repeat": repeat, **row}
                        )
            results["sizes"][size] = {tree: _tree_result(runs[tree]) for tree in trees}
            every = [r for tree in runs.values() for mode in tree.values() for r in mode]
            results["sizes"][size]["same_results_everywhere"] = all(
                _same_results(every[0]["rows"], r["rows"]) for r in every[1:]
            )
    results["overhead_share"] = {
        f"{size}/{tree}": result[tree].get("overhead_share")
        for size, result in results["sizes"].items()
        for tree in trees
    }
    results["rows"] = rows_out
    _print(results, list(trees), modes)
    write_json(args.json, results)
    return 0


def _tree_result(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One tree's studies: medians over its repeats per mode, and reuse against fresh."""

    def med(mode: str, key: str) -> float:
        values = [r["summary"][key] for r in runs.get(mode, []) if key in r["summary"]]
        return statistics.median(values) if values else float("nan")

    out: dict[str, Any] = {"summaries": {m: [r["summary"] for r in rs] for m, rs in runs.items()}}
    keys = ("overhead_share", "overhead_s", "gap_overhead_s", "first_wall_s", "total_trial_wall_s")
    for key in keys:
        if "reuse" in runs:
            out[key] = med("reuse", key)
        if "fresh" in runs:
            out[f"{key}_without_reuse"] = med("fresh", key)
    if "reuse" in runs and "fresh" in runs:
        # Sum of the trials' wall times, without reuse / with: the search's own time.
        out["speedup"] = med("fresh", "total_trial_wall_s") / med("reuse", "total_trial_wall_s")
        out["process_speedup"] = statistics.median(
            r["process_s"] for r in runs["fresh"]
        ) / statistics.median(r["process_s"] for r in runs["reuse"])
    return out


def _print(results: dict[str, Any], trees: list[str], modes: list[str]) -> None:
    headers = [
        "size",
        "tree",
        "mode",
        "trained",
        "1st trial s",
        "1st overhead s",
        "overhead s (2+)",
        "overhead share (2+)",
        "between starts s",
        "steps share",
        "eval share",
        "trials total s",
        "load avg",
    ]
    rows = []
    for size, result in results["sizes"].items():
        for tree in trees:
            for mode in modes:
                for s in result[tree]["summaries"][mode]:
                    rows.append(
                        [
                            size,
                            tree,
                            mode,
                            s.get("trained_trials", 0),
                            s.get("first_wall_s", float("nan")),
                            s.get("first_overhead_s", float("nan")),
                            s.get("overhead_s", float("nan")),
                            f"{100 * s.get('overhead_share', float('nan')):.1f} %",
                            s.get("gap_overhead_s", float("nan")),
                            f"{100 * s.get('steps_share', float('nan')):.1f} %",
                            f"{100 * s.get('eval_share', float('nan')):.1f} %",
                            s.get("total_trial_wall_s", float("nan")),
                            "-".join(f"{x:.1f}" for x in s["load"]),
                        ]
                    )
    print(table(headers, rows))
    for size, result in results["sizes"].items():
        for tree in trees:
            if "speedup" in result[tree]:
                print(
                    f"{size} {tree}: reuse speedup {result[tree]['speedup']:.2f}x over the "
                    f"trials ({result[tree]['process_speedup']:.2f}x per study process)"
                )
        print(
            f"{size}: same configurations and values in every study: "
            f"{result['same_results_everywhere']}"
        )
    print(json.dumps({"overhead_share": results["overhead_share"]}))


if __name__ == "__main__":
    sys.exit(main())
