"""Search efficiency against what users do today: same budget, same task, the full run decides.

One task: the tiny model, the bundled prompt/completion data, a full run of `--epochs`, and a
window chosen so that about half of the default space cannot fit: half of the space's
configurations have a full run the time model (calibrated here by the probe design) predicts
beyond the window at p90, the study's own test (the share beyond it at p50 is printed too). Per seed, four methods one after another, each with the same
wall-clock budget (`--minutes`):

1. `hpo`: `python -m hpo.study` with its defaults, the task's window and epochs,
   `--search-hours` equal to the peers' wall-clock budget (and `--n-trials` large, so the
   budget ends it), in its own work dir; its pick is the preset it exports.
   `search_spent_over_budget`: its wall time from launch to exit over that budget, measured
   here around the process (the study's own ledger, also launch to exit since issue 24's
   close reserve, is `search.spent_over_budget` in its row);
2. `hf`: transformers' `Trainer.hyperparameter_search(backend="optuna")`, TPE, no pruning;
3. `optuna_mlflow`: plain Optuna TPE with optuna-integration's `MLflowCallback`;
4. `random`: Optuna's RandomSampler.

Methods 2-4 know nothing of the window: fixed-step trials (`benchmarks/_peer_searches.py`).
The verdict: every configuration that was a method's pick at some point of its search gets
its full run with the window enforced (`trainers.loop.run.train` with a `WindowGuard`; a run
the window stops is scored by its validation loss at the stop), on the same validation
samples for every method of a seed. The pick's full-run loss over search time is the
best-so-far curve; the final pick's is the method's result. `infeasible_compute_share`:
the share of a method's trial seconds spent on configurations the calibrated time model
predicts (p50) beyond the window; `infeasible_trained_share` counts only trials that trained
(hpo refuses such a configuration before training when its own model agrees: what that
costs is sampling and bookkeeping, no training step).

    python benchmarks/hpo_efficiency.py [--minutes 2] [--epochs 3] [--seeds 3] [--json FILE] [--plot PNG]
        [--smoke]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _search_curves as curves  # noqa: E402
from benchmarks._common import parse_with_smoke, write_results  # noqa: E402
from benchmarks._efficiency_report import (  # noqa: E402
    METHODS,
    PEER,
    plot,
    print_table,
    summarize,
)
from common.workdir import WorkDir  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class Task:
    """The benchmark's one task, for one seed."""

    config: Any  # hpo.config.StudyConfig: model, data, epochs, evaluation, seed
    prepared: Any  # hpo.prepare.Prepared
    estimator: Any  # hpo.estimator.StudyEstimator, calibrated by the probe
    available_seconds: float

    def p50_seconds(self, params: dict[str, Any]) -> float:
        return float(self.estimator.verdict(params).full_run.seconds_p50)

    def infeasible(self, params: dict[str, Any]) -> bool:
        return self.p50_seconds(params) > self.available_seconds


# ------------------------------------------------------------------------------- the task


def calibrate(model: str, data: str, work: Path, *, smoke: bool = False) -> None:
    """Fit the time model on this machine from the probe design (`analysis.calibrate --probe`;
    `smoke`: its first 4 probes, as gpu_check.py's smoke)."""
    from analysis.calibrate import PROBE_DESIGN, calibrate_from_results, run_probes
    from analysis.timemodel.machine import this_machine

    design = PROBE_DESIGN[:4] if smoke else PROBE_DESIGN
    with tempfile.TemporaryDirectory(prefix="probe-", dir=work) as folder:
        # The whole design: under load a budget-cut probe (3 runs) mis-predicted 10x.
        results = run_probes(
            model, data, design, work_dir=folder, device="cpu", budget_seconds=1e9
        )
    calibrate_from_results(results, this_machine("cpu", "auto")).save(WorkDir(work).calibration)


def make_task(work: Path, *, epochs: float, seed: int, window_seconds: float | None) -> Task:
    """The task for `seed`; without `window_seconds`, the window half the space misses (p90)."""
    from hpo.config import Budget, FullRunConfig, StudyConfig
    from hpo.estimator import StudyEstimator
    from hpo.prepare import prepare
    from hpo.what_fits import candidates
    from trainers.data.paths import demo_data_path
    from trainers.tiny import default_tiny_model

    config = StudyConfig(
        model=str(default_tiny_model()),
        data=str(demo_data_path("prompt_completion")),
        work_dir=str(work),
        full_run=FullRunConfig(epochs=epochs),
        seed=seed,
        device="cpu",
        budget=Budget(window_hours=1000.0, safety_margin_minutes=0.0),
    )
    prepared = prepare(config)
    config = dataclasses.replace(config, eval_max_length=prepared.eval_max_length)
    estimator = StudyEstimator(config, prepared)
    prepared = estimator.prepared  # its space: what this machine lets the search propose
    if window_seconds is None:
        space = prepared.space
        # Half the space beyond the window by the p90, the study's own test of a fit: set by
        # the p50, the study's p90 found nothing that fits (the band is wide here).
        durations = [
            float(estimator.verdict(p).full_run.seconds_p90)
            for p in candidates(space, space.profile_names)
        ]
        window_seconds = curves.window_for_share(durations, 0.5)
    return Task(config, prepared, estimator, window_seconds)


def space_share(task: Task) -> dict[str, Any]:
    """The share of the space's configurations (equally likely) that cannot fit, p50 and p90."""
    from hpo.what_fits import candidates

    space = task.prepared.space
    verdicts = [task.estimator.verdict(p) for p in candidates(space, space.profile_names)]
    return {
        "configurations": len(verdicts),
        "share_beyond_p50": curves.share_beyond(
            [v.full_run.seconds_p50 for v in verdicts], task.available_seconds
        ),
        "share_beyond_p90": curves.share_beyond(
            [v.full_run.seconds_p90 for v in verdicts], task.available_seconds
        ),
        "time_model_source": verdicts[0].coefficients.source,
    }


# ----------------------------------------------------------------------------- the searches


class Refused(Exception):
    """The method declined to search: nothing fits the window by its own time model."""


def run_hpo(task: Task, work: Path, seconds: float) -> tuple[str, Path, dict[str, Any]]:
    """`python -m hpo.study` in a subprocess; returns its storage URL, exported preset and
    its summary's `search` (plan against spend)."""
    out = work / "study.json"
    command = [
        sys.executable, "-m", "hpo.study",
        "--model", str(task.config.model), "--data", str(task.config.data),
        "--epochs", f"{task.config.full_run.epochs:g}",
        "--window-hours", f"{task.available_seconds / 3600:.8f}",
        "--safety-margin-minutes", "0",
        "--search-hours", f"{seconds / 3600:.8f}", "--n-trials", "100000",
        "--seed", str(task.config.seed), "--work-dir", str(work),
        "--json", str(out), "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    (work / "study.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode == 2 and "no configuration fits" in done.stderr:
        # Its own calibration puts every configuration beyond the window at p90: no pick.
        raise Refused(done.stderr.strip().splitlines()[-1])
    if done.returncode != 0:
        raise RuntimeError(f"hpo.study exited {done.returncode}: {done.stderr.strip()[-600:]}")
    summary = json.loads(out.read_text(encoding="utf-8"))
    if summary.get("preset_path") is None:
        # The budget ran out before a trial completed (a loaded machine, a short smoke).
        raise Refused(f"no trial completed within its {seconds:.0f} s: {summary.get('states')}")
    return (
        WorkDir(work).optuna_url,
        Path(summary["preset_path"]),
        summary.get("search") or {},
    )


def run_method(method: str, task: Task, work: Path, seconds: float) -> dict[str, Any]:
    """One method's search; returns its trial records, picks and timings."""
    import optuna

    from benchmarks import _peer_searches as peers

    work.mkdir(parents=True)
    config = dataclasses.replace(task.config, work_dir=str(work))
    storage = WorkDir(work).optuna_url
    preset = None
    search: dict[str, Any] = {}
    load_start = os.getloadavg()[0]
    started = time.time()
    if method == "hpo":
        storage, preset, search = run_hpo(task, work / "study", seconds)
    elif method == "hf":
        peers.hf_search(config, task.prepared, storage=storage, work=work, seconds=seconds)
    else:
        sampler: optuna.samplers.BaseSampler = (
            optuna.samplers.TPESampler(seed=config.seed)
            if method == "optuna_mlflow"
            else optuna.samplers.RandomSampler(seed=config.seed)
        )
        mlflow_uri = WorkDir(work).mlflow_url if method == "optuna_mlflow" else None
        peers.optuna_search(
            config, task.prepared, sampler=sampler, storage=storage, work=work,
            seconds=seconds, mlflow_uri=mlflow_uri,
        )  # fmt: skip
    wall = time.time() - started
    load_end = os.getloadavg()[0]
    study = optuna.load_study(
        study_name=task.config.study_name if method == "hpo" else "search", storage=storage
    )
    records, params = trial_records(method, study, task, started)
    return {
        "records": records,
        "params": params,
        "preset": preset,
        "search_seconds": wall,
        "search": search,
        "loadavg_start": load_start,
        "loadavg_end": load_end,
    }


def trial_records(
    method: str, study: Any, task: Task, started: float
) -> tuple[list[curves.TrialRecord], dict[int, dict[str, Any]]]:
    """Each finished trial as a record, and each scored trial's configuration."""
    import optuna

    from search_spaces.sampling import params_from_trial_params

    records, params = [], {}
    for trial in study.get_trials(deepcopy=False):
        if trial.datetime_start is None or trial.datetime_complete is None:
            continue
        if method == "hpo":
            config = dict(trial.user_attrs)
            fits = bool((trial.user_attrs.get("estimate") or {}).get("fits_window", True))
        else:
            config = params_from_trial_params(trial.params, task.prepared.space)
            fits = True
        complete = trial.state == optuna.trial.TrialState.COMPLETE and trial.values
        score = float(trial.values[0]) if complete else None
        if score is not None:
            params[trial.number] = config
        records.append(
            curves.TrialRecord(
                number=trial.number,
                started=trial.datetime_start.timestamp() - started,
                finished=trial.datetime_complete.timestamp() - started,
                score=score,
                fits=fits,
                infeasible=task.infeasible(_time_params(config)),
                trained=not (method == "hpo" and trial.user_attrs.get("never_trained")),
            )
        )
    return records, params


def _time_params(config: dict[str, Any]) -> dict[str, Any]:
    """What the time model needs of a configuration (a pruned hpo trial may lack the rest)."""
    from hpo.what_fits import TIME_NEUTRAL_PARAMS

    return {**TIME_NEUTRAL_PARAMS, **{k: v for k, v in config.items() if v is not None}}


# ------------------------------------------------------------------------------ the verdict


def full_run(task: Task, spec: Any) -> dict[str, Any]:
    """The configuration's full run inside the window; a stopped run's loss is taken at the stop."""
    from trainers.loop.run import train
    from trainers.loop.window import WindowGuard

    started = time.perf_counter()
    result = train(spec, window=WindowGuard(window_seconds=task.available_seconds))
    seconds = time.perf_counter() - started
    loss = result.final_eval_loss
    if result.status == "stopped_by_window" and (
        not result.eval_losses or result.eval_losses[-1][0] != result.final_step
    ):
        loss = loss_at_checkpoint(spec, result.final_step)
    shutil.rmtree(spec.output_dir, ignore_errors=True)
    return {
        "loss": loss,
        "status": result.status,
        "fits": result.status != "stopped_by_window",
        "steps": result.final_step,
        "total_steps": result.total_steps,
        "seconds": seconds,
    }


def loss_at_checkpoint(spec: Any, step: int) -> float | None:
    """The validation loss of the checkpoint the window stop saved (resumed, no step trained)."""
    from trainers.loop.run import train

    resumed = dataclasses.replace(spec, max_steps=step)
    return train(resumed, resume=True).final_eval_loss


def verdicts(task: Task, method: str, search: dict[str, Any], work: Path) -> dict[int, Any]:
    """The full run of every configuration that was the method's pick at some point."""
    from hpo import trial_runs
    from trainers.preset import load_preset

    changes = curves.picks_over_time(search["records"])
    out: dict[int, Any] = {}
    for index, (_, number) in enumerate(changes):
        if number in out:
            continue
        output = str(work / f"full-{method}-{number}")
        final = index == len(changes) - 1
        spec = trial_runs.full_run(
            task.config,
            search["params"][number],
            model=task.prepared.model_path,
            data=task.prepared.data_path,
            output_dir=output,
        )
        if method == "hpo" and final and search["preset"] is not None:
            # The preset's configuration, under the same run settings as every other pick:
            # its recovery, early stopping and checkpoint cadence are the full run's.
            spec = dataclasses.replace(
                load_preset(search["preset"]).spec,
                output_dir=output,
                recovery=spec.recovery,
                early_stopping_patience=spec.early_stopping_patience,
                checkpoint_minutes=spec.checkpoint_minutes,
            )
        out[number] = full_run(task, spec)
        print(f"  {method} pick {number}: {_brief(out[number])}", flush=True)
    return out


def _brief(run: dict[str, Any]) -> str:
    loss = "n/a" if run["loss"] is None else f"{run['loss']:.4f}"
    return f"loss {loss}, {run['status']} at step {run['steps']}/{run['total_steps']} in {run['seconds']:.1f} s"


# ------------------------------------------------------------------------------- the report


def _refused_row(
    seed: int, method: str, reason: str, search_seconds: float, budget_seconds: float
) -> dict[str, Any]:
    """A method that declined to search (it exits before any trial): no pick, no fit."""
    return {
        "seed": seed, "method": method, "refused": reason,
        "search_seconds": search_seconds,
        "search_spent_over_budget": search_seconds / budget_seconds, "search": {},
        "trials": 0, "scored_trials": 0, "final_pick": None, "final_loss": None,
        "fits": False, "final_run": None, "curve": [], "picks": {},
        "infeasible_compute_share": 0.0, "infeasible_trained_share": 0.0,
        "trial_seconds": 0.0, "loadavg_start": None, "loadavg_end": None,
        "trial_records": [],
    }  # fmt: skip


def seed_rows(
    task: Task, seed: int, work: Path, seconds: float, methods: tuple[str, ...] = METHODS
) -> list[dict[str, Any]]:
    """The methods for one seed: search, verdict, curves."""
    rows = []
    for method in methods:
        print(f"seed {seed}: {method} searching for {seconds:.0f} s", flush=True)
        started = time.time()
        try:
            search = run_method(method, task, work / method, seconds)
        except Refused as refused:
            print(f"  {method} refused: {refused}", flush=True)
            rows.append(_refused_row(seed, method, str(refused), time.time() - started, seconds))
            continue
        runs = verdicts(task, method, search, work)
        changes = curves.picks_over_time(search["records"])
        losses = {n: r["loss"] for n, r in runs.items() if r["loss"] is not None}
        curve = curves.pick_loss_curve([c for c in changes if c[1] in losses], losses)
        final = runs[changes[-1][1]] if changes else None
        records = search["records"]
        rows.append(
            {
                "seed": seed,
                "method": method,
                "search_seconds": search["search_seconds"],
                # Launch to exit over the peers' wall-clock budget (the hpo study's budget).
                "search_spent_over_budget": search["search_seconds"] / seconds,
                "search": search["search"],
                "trials": len(records),
                "scored_trials": sum(r.score is not None for r in records),
                "final_pick": changes[-1][1] if changes else None,
                "final_loss": final["loss"] if final else None,
                "fits": final["fits"] if final else False,
                "final_run": final,
                "curve": curve,
                "picks": {str(n): r for n, r in runs.items()},
                "infeasible_compute_share": curves.infeasible_share(records),
                "infeasible_trained_share": curves.infeasible_share(records, trained_only=True),
                "trial_seconds": sum(r.seconds for r in records),
                "loadavg_start": search["loadavg_start"],
                "loadavg_end": search["loadavg_end"],
                "trial_records": [dataclasses.asdict(r) for r in records],
            }
        )
    peer = next((r for r in rows if r["method"] == PEER), None)
    for row in rows:
        if peer is None or peer["final_loss"] is None:
            reached = None
        else:
            reached = curves.time_to_reach(row["curve"], peer["final_loss"])
        row["time_to_peer_best_seconds"] = reached
        row["time_to_peer_best_ratio"] = curves.time_ratio(
            reached, peer["search_seconds"] if peer else 0.0
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.0, help="search budget per method")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=float, default=3.0, help="epochs of the full run")
    parser.add_argument("--window-seconds", type=float, help="default: half the space fits")
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="comma-separated subset (default: all)"
    )
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--plot", help="write the best-so-far plot (PNG) here")
    args = parse_with_smoke(
        parser, argv, "hpo and random, one seed, 12 s searches, 4 probes",
        seeds=1, minutes=0.2, epochs=0.3, methods="hpo,random",
    )  # fmt: skip
    methods = tuple(m for m in args.methods.split(",") if m)
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"--methods: unknown {unknown}; known: {', '.join(METHODS)}")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="hpo-efficiency-") as folder:
        work = Path(folder)
        task = _task_setup(work, args.epochs, args.window_seconds, smoke=args.smoke)
        share = space_share(task)
        print(
            f"window {task.available_seconds:.1f} s for a {args.epochs:g}-epoch full run: "
            f"{share['share_beyond_p50']:.0%} of the space's {share['configurations']} "
            f"configurations predicted (p50) beyond it, {share['share_beyond_p90']:.0%} at p90 "
            f"(time model: {share['time_model_source']})",
            flush=True,
        )
        rows: list[dict[str, Any]] = []
        for seed in range(args.seeds):
            seeded = task if seed == 0 else _reseeded(task, work, seed)
            rows += seed_rows(seeded, seed, work / f"seed-{seed}", args.minutes * 60, methods)
            if args.json:  # what is measured so far survives a later seed's crash
                write_results(args.json, {"partial": True, "rows": rows, "seeds_done": seed + 1})
    summary = summarize(rows)
    print_table(summary, rows)
    if args.plot:
        plot(rows, args.plot, task.available_seconds)
    write_results(
        args.json,
        {
            "final_loss": summary["final_loss"],
            "fit_share": summary["fit_share"],
            "time_to_peer_best_ratio": summary["time_to_peer_best_ratio"],
            "infeasible_compute_share": summary["infeasible_compute_share"],
            "infeasible_trained_share": summary["infeasible_trained_share"],
            "rows": rows,
            "search_seconds": summary["search_seconds"],
            "search_spent_over_budget": summary["search_spent_over_budget"],
            "window_seconds": task.available_seconds,
            "space": share,
            "epochs": args.epochs,
            "minutes": args.minutes,
            "seeds": args.seeds,
            "peer": PEER,
            "total_seconds": time.time() - started,
            "date": time.strftime("%Y-%m-%d"),
        },
    )
    return 0


def _task_setup(
    work: Path, epochs: float, window_seconds: float | None, *, smoke: bool = False
) -> Task:
    from trainers.data.paths import demo_data_path
    from trainers.tiny import default_tiny_model

    model, data = str(default_tiny_model()), str(demo_data_path("prompt_completion"))
    calibrate(model, data, work, smoke=smoke)
    return make_task(work, epochs=epochs, seed=0, window_seconds=window_seconds)


def _reseeded(task: Task, work: Path, seed: int) -> Task:
    """The same task and window for another seed (its own data split and order)."""
    return make_task(
        work, epochs=task.config.full_run.epochs, seed=seed, window_seconds=task.available_seconds
    )


if __name__ == "__main__":
    sys.exit(main())
