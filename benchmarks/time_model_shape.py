"""Is the time model's error in its shape (which configurations it gets wrong) or in the
machine's level (how fast the machine happens to be while a run executes)?

`time_model_accuracy.py` runs each held-out configuration once, one after the other, so a
machine whose speed wanders (a shared VM: identical runs differ by 15-50 % here) puts its
drift into every row. This benchmark separates the two. After the same probe calibration,
it measures the held-out configurations in short runs, round-robin, for several rounds
(every other round in reverse order), so every configuration meets the same mix of machine
states. Per run it compares the measured mean steady micro-step (forward + backward + the
loop around it) with the predicted one:

- ratio = measured / predicted, per run;
- level of a round = median ratio over the configurations of that round (the machine);
- shape error of a configuration = |median over rounds of (ratio / level of its round) - 1|:
  what is left after the machine's state is divided out, i.e. what the model itself gets
  wrong about that configuration.

    python benchmarks/time_model_shape.py [--rounds N] [--json FILE] [--threads N] [--smoke]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.calibrate import PROBE_DESIGN  # noqa: E402
from analysis.calibration.file import Calibration  # noqa: E402
from analysis.calibration.measurements import WARMUP_MICRO_STEPS  # noqa: E402
from analysis.planning.fits import plan_of_spec  # noqa: E402
from analysis.timemodel.model import Plan, predict  # noqa: E402
from benchmarks._common import machine, table, write_json  # noqa: E402
from benchmarks._held_out import (  # noqa: E402
    HELD_OUT,
    HeldOut,
    calibrate,
    held_out_spec,
    lengths_of,
    run_held_out,
    synthetic_data,
)
from benchmarks._levels import divide_by_level, level_spread_pct, shape_errors  # noqa: E402
from trainers.spec import TrainSpec  # noqa: E402

MICRO_STEPS = 80  # per short run: 3 warm-up + 77 steady micro-steps
SMOKE_MICRO_STEPS = 12


def short_run(
    model: str, data: str, config: HeldOut, work: Path, micro_steps: int = MICRO_STEPS
) -> TrainSpec:
    """A short run of about `micro_steps` micro-steps, without evaluations or saves."""
    steps = -(-micro_steps // config.gradient_accumulation_steps)
    return held_out_spec(model, data, config, work, "short", steps=steps, evaluations=False)


def short_plan(calibration: Calibration, spec: TrainSpec, lengths: tuple[int, ...]) -> Plan:
    """The time model's view of a short run (no evaluation samples: it evaluates none)."""
    return plan_of_spec(spec, calibration.model, lengths, n_validation=0, hardware=calibration.hardware)


def predicted_micro_seconds(calibration: Calibration, plan: Plan) -> float:
    """Predicted mean steady micro-step, loop overhead and the share of optimizer steps included."""
    c = calibration.coefficients
    estimate = predict(plan, c)
    return (
        estimate.extra["micro_step_seconds"]
        + c.loop_seconds_per_micro_step
        + estimate.extra["optimizer_step_seconds"] / plan.gradient_accumulation_steps
    )


def measured_micro_seconds(result: dict[str, Any], accumulation: int) -> float:
    """Measured mean steady micro-step, on the same footing as the prediction."""
    micro = result["micro_step_seconds"][WARMUP_MICRO_STEPS:]
    optimizer = result["optimizer_step_seconds"][1:]
    steps = len(result["micro_step_seconds"])
    loop = (
        float(result["timings"]["train"])
        - sum(result["micro_step_seconds"])
        - sum(result["optimizer_step_seconds"])
    ) / steps
    return float(np.mean(micro)) + loop + float(np.mean(optimizer)) / accumulation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="round-robin rounds (default 5)")
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"4 probes, 3 configurations, 2 rounds of {SMOKE_MICRO_STEPS} micro-steps: the "
        "suite runs it",
    )
    args = parser.parse_args(argv)
    # A level is a median over a round's configurations, a shape error one over rounds.
    design = PROBE_DESIGN[:4] if args.smoke else PROBE_DESIGN
    held_out = HELD_OUT[:3] if args.smoke else HELD_OUT
    micro_steps = SMOKE_MICRO_STEPS if args.smoke else MICRO_STEPS
    if args.smoke:
        args.rounds = 2

    import torch

    from trainers.tiny import default_tiny_model

    if args.threads:
        torch.set_num_threads(args.threads)
    model = str(default_tiny_model())
    with tempfile.TemporaryDirectory(prefix="time-model-shape-") as tmp:
        work = Path(tmp)
        data = str(synthetic_data(work / "data.jsonl"))
        probes = calibrate(model, data, work, design)
        calibration: Calibration = probes["calibration"]
        print(f"calibrated from {probes['runs']} probe runs in {probes['seconds']:.1f} s")
        specs = {
            config.name: short_run(model, data, config, work, micro_steps) for config in held_out
        }
        plans = {
            name: short_plan(calibration, spec, lengths_of(spec)[0]) for name, spec in specs.items()
        }
        predicted = {name: predicted_micro_seconds(calibration, p) for name, p in plans.items()}
        ratios, raw, levels = run_rounds(specs, plans, predicted, work, args.rounds)
    summary = summarize(predicted, ratios, raw, levels)
    summary.update(
        rounds=args.rounds,
        micro_steps_per_run=micro_steps,
        calibration_id=calibration.calibration_id,
        torch_threads=torch.get_num_threads(),
        machine=machine(),
    )
    print_report(summary)
    write_json(args.json, summary)
    return 0


def run_rounds(
    specs: dict[str, TrainSpec],
    plans: dict[str, Plan],
    predicted: dict[str, float],
    work: Path,
    rounds: int,
) -> tuple[dict[str, list[float]], list[float], list[float]]:
    """Every run, round-robin (every other round reversed).

    Returns:
        Per configuration its ratios with the round's level divided out; every run's raw
        measured / predicted; the level of each round.
    """
    measured_rounds: list[dict[str, float]] = []
    started = time.perf_counter()
    for round_index in range(rounds):
        order = list(plans) if round_index % 2 == 0 else list(reversed(plans))
        this_round: dict[str, float] = {}
        for name in order:
            output_dir = str(work / f"r{round_index}-{len(this_round)}")
            result = run_held_out(dataclasses.replace(specs[name], output_dir=output_dir))
            measured = measured_micro_seconds(result, plans[name].gradient_accumulation_steps)
            this_round[name] = measured / predicted[name]
        measured_rounds.append(this_round)
        level = divide_by_level([this_round])[1][0]
        print(
            f"round {round_index + 1}/{rounds}: level {level:.3f} "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
    ratios, levels = divide_by_level(measured_rounds)
    raw = [ratio for this_round in measured_rounds for ratio in this_round.values()]
    return ratios, raw, levels


def summarize(
    predicted: dict[str, float],
    ratios: dict[str, list[float]],
    raw: list[float],
    levels: list[float],
) -> dict[str, Any]:
    """The shape error per configuration and over all of them, and the machine's levels."""
    shape = shape_errors(ratios)
    rows = [
        {
            "config": name,
            "predicted_micro_ms": 1000 * predicted[name],
            **shape["rows"][name],
            "ratios": ratios[name],
        }
        for name in predicted
    ]
    return {
        "median_shape_abs_pct_error": shape["median_abs_pct_error"],
        "p90_shape_abs_pct_error": shape["p90_abs_pct_error"],
        "levels": levels,
        "run_ratios": raw,
        "level_spread_pct": level_spread_pct(levels),
        "rows": rows,
    }


def print_report(summary: dict[str, Any]) -> None:
    rows, levels = summary["rows"], summary["levels"]
    print()
    print(
        table(
            ["config", "pred micro ms", "shape ratio", "shape err %", "spread over rounds %"],
            [
                [r["config"], r["predicted_micro_ms"], r["shape_ratio"],
                 r["shape_abs_pct_error"], r["ratio_spread_pct"]]
                for r in rows
            ],
        )
    )  # fmt: skip
    print(
        f"\nshape |error| median {summary['median_shape_abs_pct_error']:.1f} %, p90 "
        f"{summary['p90_shape_abs_pct_error']:.1f} %; machine level per round "
        f"{', '.join(f'{v:.3f}' for v in levels)} (spread {summary['level_spread_pct']:.0f} %)"
    )
    print("\nmeasured / predicted of every short run (the machine's states show as clusters):")
    print(histogram(summary["run_ratios"]))


def histogram(values: list[float], width: float = 0.05) -> str:
    """A text histogram, one line per bin of `width`."""
    low = math.floor(min(values) / width) * width
    counts = np.bincount(np.floor((np.asarray(values) - low) / width + 1e-9).astype(int))
    return "\n".join(
        f"  {low + i * width:4.2f}-{low + (i + 1) * width:4.2f} {'#' * int(n)}"
        for i, n in enumerate(counts)
    )


if __name__ == "__main__":
    sys.exit(main())
