"""How well does the calibrated time model predict runs it has never seen?

Calibrates from the short probe design of `python -m analysis.calibrate --probe` (about a
minute in all), then predicts and actually trains held-out configurations: other
micro-batches, accumulations, max_lengths and ranks than any probe, each with evaluations
and checkpoint saves, each at least 10x as long as the longest probe. Reports the absolute
% error of the predicted median duration twice: raw, and with the machine's drift divided
out (each repeat divided by its median, as `time_model_shape.py` does: the shape error),
next to the noise floor it measured (one configuration's spread over repeats); how often
the measured duration fell inside the predicted p10-p90 band; and for peak memory the error
of the median and how often a run exceeded the predicted p90.

The tiny demo model trains on a synthetic data set built from the bundled demo texts, with
lengths spread up to ~400 tokens so that max_length matters.

    python benchmarks/time_model_accuracy.py [--json FILE] [--threads N] [--repeats N]
        [--holdout-factor X] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.calibrate import PROBE_DESIGN  # noqa: E402
from analysis.calibration.file import Calibration  # noqa: E402
from benchmarks._common import machine, median, table, write_json  # noqa: E402
from benchmarks._held_out import (  # noqa: E402
    HELD_OUT,
    HOLDOUT_FACTOR,
    HeldOut,
    calibrate,
    held_out_spec,
    lengths_of,
    run_held_out,
    size_run,
    synthetic_data,
)
from benchmarks._levels import divide_by_level, level_spread_pct, shape_errors  # noqa: E402
from benchmarks.time_model_refit import raw_payload  # noqa: E402
from trainers.spec import TrainSpec  # noqa: E402


def held_out_row(
    model: str,
    data: str,
    work: Path,
    probes: dict[str, Any],
    index: int,
    config: HeldOut,
    holdout_factor: float = HOLDOUT_FACTOR,
) -> dict[str, Any]:
    """Predict one held-out configuration, then train it and compare."""
    calibration: Calibration = probes["calibration"]
    name = f"held-out-{index}"

    def spec_of(steps: int) -> TrainSpec:
        return held_out_spec(model, data, config, work, name, steps=steps)

    lengths, n_validation = lengths_of(spec_of(1))
    spec, plan, estimate = size_run(
        calibration, spec_of, lengths, n_validation, holdout_factor * probes["longest_seconds"]
    )
    result = run_held_out(spec)
    measured = float(result["wall_seconds"])
    memory = float(result["peak_memory_bytes"])
    reserved = float(result.get("peak_reserved_bytes") or 0)  # CUDA only
    return {
        "config": config.name,
        "optimizer_steps": plan.max_steps,
        "evaluations": len(result["eval_records"]),
        "checkpoints": len(result["checkpoint_seconds"]),
        "predicted_p10_s": estimate.seconds_p10,
        "predicted_p50_s": estimate.seconds_p50,
        "predicted_p90_s": estimate.seconds_p90,
        "measured_s": measured,
        "abs_pct_error": 100 * abs(estimate.seconds_p50 - measured) / measured,
        "inside_band": estimate.seconds_p10 <= measured <= estimate.seconds_p90,
        "x_median_probe": measured / probes["median_seconds"],
        "x_longest_probe": measured / probes["longest_seconds"],
        "predicted_memory_mb": estimate.peak_memory_bytes / 2**20,
        "predicted_memory_p90_mb": estimate.peak_memory_bytes_p90 / 2**20,
        "measured_memory_mb": memory / 2**20,
        "memory_abs_pct_error": 100 * abs(estimate.peak_memory_bytes - memory) / memory,
        "memory_pct_above_p50": 100 * (memory / estimate.peak_memory_bytes - 1),
        "memory_above_p90": memory > estimate.peak_memory_bytes_p90,
        # CUDA: the allocator's reserved peak against the bound the memory check compares.
        "predicted_reserved_p90_mb": estimate.memory_bound_bytes / 2**20,
        "measured_reserved_mb": reserved / 2**20,
        "reserved_above_bound": reserved > estimate.memory_bound_bytes if reserved else None,
        "predicted_breakdown_s": estimate.breakdown,
        "measured_breakdown_s": result["timings"],
        "result": result,  # the trainer's dict, for --raw; dropped from the summary
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument(
        "--threads", type=int, help="torch CPU threads (default: torch's own choice)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the whole protocol (fresh probes, then every held-out run) this many "
        "times, every other time in reverse order; errors use the median over repeats",
    )
    parser.add_argument(
        "--raw",
        help="also write what the probes and held-out runs measured (first repeat) to this "
        "file, for python -m benchmarks.time_model_refit",
    )
    parser.add_argument(
        "--holdout-factor",
        type=float,
        default=HOLDOUT_FACTOR,
        help=f"size held-out runs to this many times the longest probe (default "
        f"{HOLDOUT_FACTOR:g}; smaller is quicker but tests less extrapolation in length)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="4 probes, 2 held-out runs 1.5x the longest probe: the suite runs it",
    )
    args = parser.parse_args(argv)
    # The cut gpu_check.py's smoke makes: enough probes to fit, two runs to compare.
    design = PROBE_DESIGN[:4] if args.smoke else PROBE_DESIGN
    held_out = HELD_OUT[:2] if args.smoke else HELD_OUT
    if args.smoke:
        args.holdout_factor, args.repeats = 1.5, 1

    import torch

    from trainers.tiny import default_tiny_model

    if args.threads:
        torch.set_num_threads(args.threads)
    model = str(default_tiny_model())
    repeats: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    noise: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="time-model-accuracy-") as tmp:
        data = str(synthetic_data(Path(tmp) / "data.jsonl"))
        for r in range(max(args.repeats, 1)):
            work = Path(tmp) / f"repeat-{r}"
            probes = calibrate(model, data, work, design)
            print(
                f"repeat {r + 1}: calibrated from {probes['runs']} probe runs in "
                f"{probes['seconds']:.1f} s (median {probes['median_seconds']:.1f} s, longest "
                f"{probes['longest_seconds']:.1f} s)",
                flush=True,
            )
            order = list(enumerate(held_out))
            rows: list[dict[str, Any]] = [{}] * len(order)
            for index, config in order if r % 2 == 0 else reversed(order):
                rows[index] = row = held_out_row(
                    model, data, work, probes, index, config, args.holdout_factor
                )
                print(
                    f"  {row['config']:<22} predicted {row['predicted_p50_s']:6.1f} s, measured "
                    f"{row['measured_s']:6.1f} s ({row['abs_pct_error']:.1f} %)",
                    flush=True,
                )
            repeats.append((probes, rows))
        if len(repeats) == 1:
            # The noise floor: the first configuration once more, unchanged.
            noise = held_out_row(
                model, data, work, probes, len(held_out), held_out[0], args.holdout_factor
            )
    if args.raw:
        first_probes, first_rows = repeats[0]
        write_json(args.raw, raw_payload(first_probes["hardware"], first_probes["results"],
                                         first_rows))  # fmt: skip
    for _, rows_r in repeats:
        for row in rows_r:
            row.pop("result", None)
    if noise is not None:
        noise.pop("result", None)
    summary = summarize(repeats, noise)
    summary["torch_threads"] = torch.get_num_threads()
    summary["holdout_factor"] = args.holdout_factor
    print_report(summary)
    write_json(args.json, summary)
    return 0


def reserved_above_bound_fraction(rows: list[dict[str, Any]]) -> float | None:
    """Of the rows that measured the allocator's reserved peak (CUDA), the share above the
    memory check's bound; None where none did (a CPU)."""
    measured = [r["reserved_above_bound"] for r in rows if r.get("reserved_above_bound") is not None]
    return sum(measured) / len(measured) if measured else None


def summarize(
    repeats: list[tuple[dict[str, Any], list[dict[str, Any]]]], noise: dict[str, Any] | None
) -> dict[str, Any]:
    """Per configuration, the median over repeats of measured / predicted and its error.

    With one repeat this is the plain single-run error; the band coverage and the memory
    figures always count single runs. The shape error divides each repeat by its median
    ratio (the machine's level while it ran) first. The noise floor is the spread of one
    configuration's measured / predicted over the repeats (median over configurations),
    or with one repeat the difference of the first configuration run again at the end.
    """
    singles = [row for _, rows in repeats for row in rows]
    corrected, levels = divide_by_level(
        [{row["config"]: row["measured_s"] / row["predicted_p50_s"] for row in rows}
         for _, rows in repeats]
    )  # fmt: skip
    shape = shape_errors(corrected)
    rows = []
    for index, config in enumerate(HELD_OUT[: len(repeats[0][1])]):
        runs = [rows_r[index] for _, rows_r in repeats]
        ratios = [r["measured_s"] / r["predicted_p50_s"] for r in runs]
        ratio = median(ratios)
        rows.append(
            {
                **runs[0],
                "config": config.name,
                "measured_over_predicted": ratios,
                "abs_pct_error": 100 * abs(1 - 1 / ratio),
                **shape["rows"][config.name],
                "band_hits": sum(r["inside_band"] for r in runs),
                "repeat_spread_pct": 100 * (max(ratios) / min(ratios) - 1),
                "runs": runs,
            }
        )
    errors = [r["abs_pct_error"] for r in rows]
    summary: dict[str, Any] = {
        "median_abs_pct_error": median(errors),
        "p90_abs_pct_error": float(np.percentile(errors, 90)),
        "shape_median_abs_pct_error": shape["median_abs_pct_error"],
        "shape_p90_abs_pct_error": shape["p90_abs_pct_error"],
        "band_coverage": sum(r["inside_band"] for r in singles) / len(singles),
        "memory_median_abs_pct_error": median([r["memory_abs_pct_error"] for r in singles]),
        "memory_above_p90_fraction": sum(r["memory_above_p90"] for r in singles) / len(singles),
        "reserved_above_bound_fraction": reserved_above_bound_fraction(singles),
        "memory_max_pct_above_p50": max(r["memory_pct_above_p50"] for r in singles),
        "levels": levels,
        "level_spread_pct": level_spread_pct(levels),
        "repeats": len(repeats),
    }
    if noise is not None:
        first = rows[0]["measured_s"]
        summary["repeat_difference_pct"] = 100 * abs(noise["measured_s"] - first) / first
        summary["noise_floor_pct"] = summary["repeat_difference_pct"]
        summary["repeat"] = noise
    else:
        summary["repeat_spread_pct_median"] = median([r["repeat_spread_pct"] for r in rows])
        summary["noise_floor_pct"] = summary["repeat_spread_pct_median"]
    probes = [p for p, _ in repeats]
    summary.update(
        {
            "probe_runs": probes[0]["runs"],
            "probe_seconds": median([p["seconds"] for p in probes]),
            "median_probe_seconds": median([p["median_seconds"] for p in probes]),
            "longest_probe_seconds": max(p["longest_seconds"] for p in probes),
            "calibrations": [
                {
                    "id": p["calibration"].calibration_id,
                    "n_measurements": p["calibration"].n_measurements,
                    "coefficients": p["calibration"].coefficients.to_dict(),
                }
                for p in probes
            ],
            "machine": machine(),
            "rows": rows,
        }
    )
    return summary


def print_report(summary: dict[str, Any]) -> None:
    rows = summary["rows"]
    print()
    if summary["repeats"] == 1:
        print(
            table(
                ["config", "steps", "evals", "ckpts", "pred p50 s", "p10-p90 s", "measured s",
                 "err %", "shape err %", "in band", "x longest probe", "mem p50 MB",
                 "mem p90 MB", "mem meas MB"],
                [
                    [r["config"], r["optimizer_steps"], r["evaluations"], r["checkpoints"],
                     r["predicted_p50_s"],
                     f"{r['predicted_p10_s']:.1f}-{r['predicted_p90_s']:.1f}",
                     r["measured_s"], r["abs_pct_error"], r["shape_abs_pct_error"],
                     "yes" if r["inside_band"] else "no", r["x_longest_probe"],
                     r["predicted_memory_mb"], r["predicted_memory_p90_mb"],
                     r["measured_memory_mb"]]
                    for r in rows
                ],
            )
        )  # fmt: skip
    else:
        print(
            table(
                ["config", "measured / predicted per repeat", "median err %", "shape err %",
                 "in band", "spread over repeats %", "x longest probe (min)",
                 "mem meas / p90 (max)"],
                [
                    [r["config"], " ".join(f"{v:.3f}" for v in r["measured_over_predicted"]),
                     r["abs_pct_error"], r["shape_abs_pct_error"],
                     f"{r['band_hits']}/{summary['repeats']}", r["repeat_spread_pct"],
                     min(x["x_longest_probe"] for x in r["runs"]),
                     max(x["measured_memory_mb"] / x["predicted_memory_p90_mb"]
                         for x in r["runs"])]
                    for r in rows
                ],
            )
        )  # fmt: skip
    print(
        f"\nraw median |error| {summary['median_abs_pct_error']:.1f} %, "
        f"p90 {summary['p90_abs_pct_error']:.1f} %; with the drift divided out (shape) "
        f"median {summary['shape_median_abs_pct_error']:.1f} %, "
        f"p90 {summary['shape_p90_abs_pct_error']:.1f} %; machine level per repeat "
        f"{', '.join(f'{v:.3f}' for v in summary['levels'])}"
    )
    print(
        f"inside p10-p90 {100 * summary['band_coverage']:.0f} % of single runs; "
        f"memory median |error| {summary['memory_median_abs_pct_error']:.1f} %, "
        f"above the predicted p90 {100 * summary['memory_above_p90_fraction']:.0f} % of runs, "
        f"at most {summary['memory_max_pct_above_p50']:+.1f} % against the p50 "
        f"(probes: {summary['probe_runs']} runs, {summary['probe_seconds']:.0f} s)"
    )
    if "repeat_difference_pct" in summary:
        print(
            f"noise floor {summary['noise_floor_pct']:.1f} %: the first configuration, run "
            "again at the end, differed by that much from its first run"
        )
    else:
        print(
            f"noise floor {summary['noise_floor_pct']:.1f} %: measured / predicted of one "
            "configuration varied over the repeats by that much (median over configurations)"
        )


if __name__ == "__main__":
    sys.exit(main())
