"""What MLflow tracking costs a trial: hpo's tracker against no tracking and against
optuna-integration's `MLflowCallback`, side by side in one run; `hpo+system` adds MLflow's
system-metrics monitor (CPU, memory, GPU) on the trial's run, as a study does.

Each trial is a real short LoRA training of the tiny model. The three modes take turns
trial by trial. Time spent inside tracking calls on the trial's path is measured directly
(wall clock around every tracker call, the per-step buffering included); hpo's store calls
run on a background writer and are reported apart (they overlap training and compete for
the CPU). The share is tracking time / trial wall time.

    python benchmarks/tracking_overhead.py [--json FILE] [--trials 6] [--steps 30]
        [--system-metrics-seconds 10] [--smoke]
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import median, parse_with_smoke, table, write_results  # noqa: E402
from hpo.tracking import Tracker, TrialMetrics  # noqa: E402
from trainers.data.paths import demo_data_path  # noqa: E402
from trainers.loop.run import train  # noqa: E402
from trainers.run_spec import Settings, run_spec  # noqa: E402
from trainers.spec import TrainSpec  # noqa: E402
from trainers.system_metrics import SystemMetrics  # noqa: E402
from trainers.tiny import default_tiny_model  # noqa: E402


class Stopwatch:
    """Accumulates wall time spent inside wrapped callables.

    A wrapped call inside another (a tracker method queuing through the writer) is counted
    once, in the outer call. With `thread`, calls from other threads are not counted (the
    system-metrics sampler queues through the same writer, off the trial's path).
    """

    def __init__(self, thread: threading.Thread | None = None) -> None:
        self.seconds = 0.0
        self._depth = 0
        self._thread = thread

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._thread is not None and threading.current_thread() is not self._thread:
                return fn(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.perf_counter() - start

        return timed


def timed_tracker(tracker: Tracker, watch: Stopwatch, store_watch: Stopwatch) -> Tracker:
    """Time the tracker's calls on the trial's path, and its store calls on its writer thread.

    The trial's path reaches the store only through the writer's queue (`log_batch`,
    `set_terminated`, `submit`); every record the writer thread sends goes through
    `store.send`.
    """
    for name in ("start_trial", "end_trial", "update_parent"):
        setattr(tracker, name, watch.wrap(getattr(tracker, name)))
    for name in ("log_batch", "set_terminated", "submit"):
        setattr(tracker.writer, name, watch.wrap(getattr(tracker.writer, name)))
    tracker.writer.store.send = store_watch.wrap(tracker.writer.store.send)  # type: ignore[method-assign]
    return tracker


class TimedMetrics(TrialMetrics):
    """hpo's per-step buffering, with its own time counted as overhead."""

    def __init__(self, tracker: Tracker, run_id: str, watch: Stopwatch) -> None:
        super().__init__(tracker, run_id)
        self.on_step = watch.wrap(self.on_step)  # type: ignore[method-assign]
        self.on_eval = watch.wrap(self.on_eval)  # type: ignore[method-assign]
        self.on_train_end = watch.wrap(self.on_train_end)  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--trials", type=int, default=6, help="trials per mode")
    parser.add_argument("--steps", type=int, default=30,
                        help="optimizer steps per trial (the study's default fidelity)")  # fmt: skip
    parser.add_argument(
        "--system-metrics-seconds", type=float, default=10.0, help="hpo+system's sampling interval"
    )
    args = parse_with_smoke(
        parser, argv, "one trial per mode of 2 steps, seconds",
        trials=1, steps=2, system_metrics_seconds=1.0,
    )  # fmt: skip
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    work = Path(tempfile.mkdtemp(prefix="bench-tracking-"))
    model = str(default_tiny_model())

    def spec(trial_number: int, lr: float) -> TrainSpec:
        return run_spec(
            {"lora_r": 8, "micro_batch_size": 8, "learning_rate": lr},
            Settings(
                work_dir=work,
                eval_interval=max(1, args.steps // 2),
                eval_samples=16,
                seed=trial_number,
            ),
            model=model,
            data=str(demo_data_path("prompt_completion")),
            output_dir=work / "out",
            max_steps=args.steps,
        )

    # Set-up costs paid once per study (tracking store creation), reported apart.
    setup_start = time.perf_counter()
    watch = Stopwatch(threading.current_thread())
    store_watch = Stopwatch()  # the writer's one thread
    tracker = timed_tracker(
        Tracker(f"sqlite:///{work / 'hpo.db'}", "bench-hpo"), watch, store_watch
    )
    study_hpo = optuna.create_study(study_name="hpo", storage=f"sqlite:///{work / 'optuna.db'}")
    parent = tracker.ensure_parent(study_hpo, {"benchmark": "tracking_overhead"})
    setup_seconds = time.perf_counter() - setup_start

    from optuna_integration import MLflowCallback

    callback_watch = Stopwatch()
    mlflow_callback = MLflowCallback(
        tracking_uri=f"sqlite:///{work / 'cb.db'}", metric_name="val_loss"
    )
    timed_callback = callback_watch.wrap(mlflow_callback)
    study_off = optuna.create_study(study_name="off", storage=f"sqlite:///{work / 'optuna.db'}")
    study_cb = optuna.create_study(study_name="cb", storage=f"sqlite:///{work / 'optuna.db'}")

    def run_trial(mode: str) -> tuple[float, float, float]:
        study = {"off": study_off, "hpo": study_hpo, "hpo+system": study_hpo,
                 "mlflowcallback": study_cb}[mode]  # fmt: skip
        tracked = mode.startswith("hpo")
        trial = study.ask()
        lr = trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True)
        tracker.flush()  # the previous trial's queued writes are not this trial's
        before = watch.seconds + callback_watch.seconds
        store_before = store_watch.seconds
        start = time.perf_counter()
        callbacks: list[Any] = []
        run_id: Any = ""
        if tracked:
            run_id = tracker.start_trial(parent, "hpo", trial.number, {"learning_rate": lr})
            if mode == "hpo+system":
                system = SystemMetrics(
                    tracker.writer, run_id, interval_seconds=args.system_metrics_seconds
                )
                system.on_train_begin = watch.wrap(system.on_train_begin)  # type: ignore[method-assign]
                system.on_train_end = watch.wrap(system.on_train_end)  # type: ignore[method-assign]
                callbacks.append(system)
            callbacks.append(TimedMetrics(tracker, run_id, watch))
        result = train(spec(trial.number, lr), callbacks)
        value = float(result.final_eval_loss or 0.0)
        if tracked:
            tracker.end_trial(run_id, "complete", metrics={"value": value})
        frozen = study.tell(trial, value)
        if tracked:
            tracker.update_parent(parent, study)
        elif mode == "mlflowcallback":
            timed_callback(study, frozen)
        elapsed = time.perf_counter() - start
        tracker.flush()
        return (
            elapsed,
            watch.seconds + callback_watch.seconds - before,
            store_watch.seconds - store_before,
        )

    modes = ["off", "hpo", "hpo+system", "mlflowcallback"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    overheads: dict[str, list[float]] = {m: [] for m in modes}
    store_seconds: list[float] = []
    for i in range(args.trials):
        k = i % len(modes)
        order = modes[k:] + modes[:k]  # rotate so no mode always runs first
        for mode in order:
            elapsed, overhead, store = run_trial(mode)
            times[mode].append(elapsed)
            overheads[mode].append(overhead)
            if mode == "hpo":
                store_seconds.append(store)

    rows = []
    summary: dict[str, dict[str, Any]] = {}
    for mode in modes:
        t_ms = median(times[mode]) * 1000
        o_ms = median(overheads[mode]) * 1000
        pct = 100 * median([o / t for o, t in zip(overheads[mode], times[mode], strict=True)])
        # The noise: the lowest and highest trial of the mode (the same configuration's trials
        # differ by the machine's drift and the learning rate drawn).
        t_range = [min(times[mode]) * 1000, max(times[mode]) * 1000]
        o_range = [min(overheads[mode]) * 1000, max(overheads[mode]) * 1000]
        # The keys in the order of the JSON file, which writes these dicts whole.
        summary[mode] = {"overhead_percent": pct, "overhead_ms_per_trial": o_ms, "trial_ms": t_ms,
                         "trial_ms_range": t_range, "overhead_ms_range": o_range}  # fmt: skip
        rows.append([mode, t_ms, f"{t_range[0]:,.0f}-{t_range[1]:,.0f}", o_ms,
                     f"{o_range[0]:.1f}-{o_range[1]:.1f}", pct])  # fmt: skip
    print(table(["mode", "trial ms (median)", "trial ms min-max", "tracking ms/trial",
                 "tracking ms min-max", "share %"], rows))  # fmt: skip
    store_ms = median(store_seconds) * 1000
    print(
        f"hpo's store calls on its background writer: {store_ms:.0f} ms/trial "
        f"({100 * store_ms / summary['hpo']['trial_ms']:.2f} % of trial time, overlapping training)"
    )
    print(
        f"whole-trial difference hpo - off: {summary['hpo']['trial_ms'] - summary['off']['trial_ms']:+.0f} ms "
        "(training-time noise of this machine included)"
    )
    print(
        f"whole-trial difference hpo+system - hpo: "
        f"{summary['hpo+system']['trial_ms'] - summary['hpo']['trial_ms']:+.0f} ms "
        f"(sampling every {args.system_metrics_seconds:g} s on a background thread)"
    )
    print(
        f"one-time set-up (tracking store + experiment + parent run): {setup_seconds * 1000:.0f} ms"
    )
    print("targets: <= 1 % of trial time and <= 50 ms per trial")
    write_results(
        args.json,
        {
            **summary["hpo"],
            "untracked_trial_ms": summary["off"]["trial_ms"],
            "system_metrics": {
                "interval_seconds": args.system_metrics_seconds,
                **summary["hpo+system"],
            },
            "mlflowcallback": summary["mlflowcallback"],
            "background_store_ms_per_trial": store_ms,
            "setup_ms": setup_seconds * 1000,
            "trials_per_mode": args.trials,
            "steps_per_trial": args.steps,
        },
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
