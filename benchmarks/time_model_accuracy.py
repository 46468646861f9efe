"""How well does the calibrated time model predict runs it has never seen?

Calibrates from the short probe design of `python -m analysis.calibrate --probe` (about a
minute in all), then predicts and actually trains held-out configurations: other
micro-batches, accumulations, max_lengths and ranks than any probe, each with evaluations
and checkpoint saves, each at least 10x as long as the longest probe. Reports the absolute
% error of the predicted median duration, how often the measured duration fell inside the
predicted p10-p90 band, and the same error for peak memory.

The tiny demo model trains on a synthetic data set built from the bundled demo texts, with
lengths spread up to ~400 tokens so that max_length matters.

    python benchmarks/time_model_accuracy.py [--json FILE] [--threads N] [--repeats N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.calibrate import PROBE_DESIGN, calibrate_from_results, run_probes  # noqa: E402
from analysis.calibration import Calibration  # noqa: E402
from analysis.plans import plan_for, probe_spec  # noqa: E402
from analysis.timemodel import Estimate, Plan, predict  # noqa: E402
from benchmarks._common import machine, median, table, write_json  # noqa: E402
from trainers.spec import TrainSpec  # noqa: E402

EVAL_SAMPLES = 16
HOLDOUT_FACTOR = 12.0  # held-out runs are sized to ~12x the longest probe (>= 10x measured)


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """One held-out configuration (no level is shared with the probe design)."""

    micro_batch_size: int
    gradient_accumulation_steps: int
    max_length: int
    lora_r: int

    @property
    def name(self) -> str:
        return (
            f"mb{self.micro_batch_size} ga{self.gradient_accumulation_steps} "
            f"len{self.max_length} r{self.lora_r}"
        )


# The probes use micro-batch 1/2/4/8, accumulation 1/2, max_length 64/128/256/512 and rank
# 4/32/64; the held-out runs share none of these levels. Their padded tokens per micro-batch
# stay within the probes' range (up to ~2,000), so the test is interpolation across
# configurations, not extrapolation beyond them.
HELD_OUT = (
    HeldOut(3, 4, 96, 8),
    HeldOut(6, 3, 192, 16),
    HeldOut(12, 3, 96, 48),
    HeldOut(3, 3, 384, 16),
    HeldOut(6, 4, 320, 8),
    HeldOut(12, 4, 160, 16),
    HeldOut(3, 4, 320, 48),
    HeldOut(6, 3, 96, 48),
    HeldOut(3, 3, 192, 8),
)


def synthetic_data(out: Path, *, samples: int = 1200, seed: int = 0) -> Path:
    """Texts of 1 to 40 demo records each: token lengths spread from ~10 to ~400."""
    from trainers.data.paths import demo_data_path

    with demo_data_path("text").open(encoding="utf-8") as lines:
        texts = [json.loads(line)["text"] for line in lines]
    rng = random.Random(seed)
    with out.open("w", encoding="utf-8") as handle:
        for _ in range(samples):
            start = rng.randrange(len(texts))
            count = rng.randint(1, 40)
            text = " ".join(texts[(start + i) % len(texts)] for i in range(count))
            handle.write(json.dumps({"text": text}) + "\n")
    return out


def held_out_spec(
    model: str,
    data: str,
    config: HeldOut,
    work: Path,
    name: str,
    *,
    steps: int,
    evaluations: bool = True,
) -> TrainSpec:
    """A held-out run of `steps` optimizer steps: about three evaluations and two saves."""
    return probe_spec(
        config,
        model=model,
        data=data,
        work_dir=work,
        name=name,
        max_steps=steps,
        eval_interval=max(1, steps // 3) if evaluations else 0,
        checkpoint_interval=max(1, steps // 2) if evaluations else 0,
        eval_samples=EVAL_SAMPLES,
    )


def lengths_of(spec: TrainSpec) -> tuple[tuple[int, ...], int]:
    """Train token lengths at the spec's max_length and the validation count (as it trains)."""
    from trainers.data.dataset import load_tokenized
    from trainers.model.lora import load_tokenizer

    loaded = load_tokenized(spec.data_spec(), load_tokenizer(spec.model))
    return tuple(len(e.input_ids) for e in loaded.train), len(loaded.validation)


def size_run(
    calibration: Calibration,
    spec_of: Callable[[int], TrainSpec],
    lengths: tuple[int, ...],
    n_validation: int,
    target_seconds: float,
) -> tuple[TrainSpec, Plan, Estimate]:
    """The fewest optimizer steps whose predicted median reaches `target_seconds`.

    Args:
        calibration: The fitted time model.
        spec_of: The run of a given number of optimizer steps.
        lengths: Its train token lengths.
        n_validation: Its validation samples.
        target_seconds: The duration to reach.
    """

    def plan(steps: int) -> Plan:
        return plan_for(
            spec_of(steps),
            calibration.model,
            lengths,
            n_validation=n_validation,
            hardware=calibration.hardware,
        )

    def seconds(steps: int) -> float:
        return predict(plan(steps), calibration.coefficients).seconds_p50

    low, high = 1, 2
    while seconds(high) < target_seconds:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if seconds(middle) < target_seconds else (low, middle)
    return spec_of(high), plan(high), predict(plan(high), calibration.coefficients)


def run_held_out(spec: TrainSpec) -> dict[str, Any]:
    """Train `spec`; return the trainer's result dict."""
    from trainers.loop.run import train

    return train(spec).to_dict()


def calibrate(model: str, data: str, work: Path) -> dict[str, Any]:
    """Run the probe design and fit."""
    from analysis.machine import this_machine

    started = time.perf_counter()
    probes = run_probes(model, data, PROBE_DESIGN, work_dir=work / "probes")
    seconds = time.perf_counter() - started
    walls = [float(p["wall_seconds"]) for p in probes]
    return {
        "calibration": calibrate_from_results(probes, this_machine()),
        "runs": len(probes),
        "seconds": seconds,
        "median_seconds": median(walls),
        "longest_seconds": max(walls),
    }


def held_out_row(
    model: str, data: str, work: Path, probes: dict[str, Any], index: int, config: HeldOut
) -> dict[str, Any]:
    """Predict one held-out configuration, then train it and compare."""
    calibration: Calibration = probes["calibration"]
    name = f"held-out-{index}"

    def spec_of(steps: int) -> TrainSpec:
        return held_out_spec(model, data, config, work, name, steps=steps)

    lengths, n_validation = lengths_of(spec_of(1))
    spec, plan, estimate = size_run(
        calibration, spec_of, lengths, n_validation, HOLDOUT_FACTOR * probes["longest_seconds"]
    )
    result = run_held_out(spec)
    measured = float(result["wall_seconds"])
    memory = float(result["peak_memory_bytes"])
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
        "measured_memory_mb": memory / 2**20,
        "memory_abs_pct_error": 100 * abs(estimate.peak_memory_bytes - memory) / memory,
        "predicted_breakdown_s": estimate.breakdown,
        "measured_breakdown_s": result["timings"],
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
    args = parser.parse_args(argv)

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
            probes = calibrate(model, data, work)
            print(
                f"repeat {r + 1}: calibrated from {probes['runs']} probe runs in "
                f"{probes['seconds']:.1f} s (median {probes['median_seconds']:.1f} s, longest "
                f"{probes['longest_seconds']:.1f} s)",
                flush=True,
            )
            order = list(enumerate(HELD_OUT))
            rows: list[dict[str, Any]] = [{}] * len(order)
            for index, config in order if r % 2 == 0 else reversed(order):
                rows[index] = row = held_out_row(model, data, work, probes, index, config)
                print(
                    f"  {row['config']:<22} predicted {row['predicted_p50_s']:6.1f} s, measured "
                    f"{row['measured_s']:6.1f} s ({row['abs_pct_error']:.1f} %)",
                    flush=True,
                )
            repeats.append((probes, rows))
        if len(repeats) == 1:
            # The noise floor: the first configuration once more, unchanged.
            noise = held_out_row(model, data, work, probes, len(HELD_OUT), HELD_OUT[0])
    summary = summarize(repeats, noise)
    summary["torch_threads"] = torch.get_num_threads()
    print_report(summary)
    write_json(args.json, summary)
    return 0


def summarize(
    repeats: list[tuple[dict[str, Any], list[dict[str, Any]]]], noise: dict[str, Any] | None
) -> dict[str, Any]:
    """Per configuration, the median over repeats of measured / predicted and its error.

    With one repeat this is the plain single-run error; the band coverage and the memory
    error always count single runs.
    """
    singles = [row for _, rows in repeats for row in rows]
    rows = []
    for index, config in enumerate(HELD_OUT):
        runs = [rows_r[index] for _, rows_r in repeats]
        ratios = [r["measured_s"] / r["predicted_p50_s"] for r in runs]
        ratio = median(ratios)
        rows.append(
            {
                **runs[0],
                "config": config.name,
                "measured_over_predicted": ratios,
                "abs_pct_error": 100 * abs(1 - 1 / ratio),
                "band_hits": sum(r["inside_band"] for r in runs),
                "repeat_spread_pct": 100 * (max(ratios) / min(ratios) - 1),
                "runs": runs,
            }
        )
    errors = [r["abs_pct_error"] for r in rows]
    summary: dict[str, Any] = {
        "median_abs_pct_error": median(errors),
        "p90_abs_pct_error": float(np.percentile(errors, 90)),
        "band_coverage": sum(r["inside_band"] for r in singles) / len(singles),
        "memory_median_abs_pct_error": median([r["memory_abs_pct_error"] for r in singles]),
        "repeats": len(repeats),
    }
    if noise is not None:
        first = rows[0]["measured_s"]
        summary["repeat_difference_pct"] = 100 * abs(noise["measured_s"] - first) / first
        summary["repeat"] = noise
    else:
        summary["repeat_spread_pct_median"] = median([r["repeat_spread_pct"] for r in rows])
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
                 "err %", "in band", "x longest probe", "mem pred MB", "mem meas MB"],
                [
                    [r["config"], r["optimizer_steps"], r["evaluations"], r["checkpoints"],
                     r["predicted_p50_s"],
                     f"{r['predicted_p10_s']:.1f}-{r['predicted_p90_s']:.1f}",
                     r["measured_s"], r["abs_pct_error"], "yes" if r["inside_band"] else "no",
                     r["x_longest_probe"], r["predicted_memory_mb"], r["measured_memory_mb"]]
                    for r in rows
                ],
            )
        )  # fmt: skip
    else:
        print(
            table(
                ["config", "measured / predicted per repeat", "median err %", "in band",
                 "spread over repeats %", "x longest probe (min)"],
                [
                    [r["config"], " ".join(f"{v:.3f}" for v in r["measured_over_predicted"]),
                     r["abs_pct_error"], f"{r['band_hits']}/{summary['repeats']}",
                     r["repeat_spread_pct"], min(x["x_longest_probe"] for x in r["runs"])]
                    for r in rows
                ],
            )
        )  # fmt: skip
    print(
        f"\nmedian |error| {summary['median_abs_pct_error']:.1f} %, "
        f"p90 {summary['p90_abs_pct_error']:.1f} %, "
        f"inside p10-p90 {100 * summary['band_coverage']:.0f} % of single runs, "
        f"memory median |error| {summary['memory_median_abs_pct_error']:.1f} % "
        f"(probes: {summary['probe_runs']} runs, {summary['probe_seconds']:.0f} s)"
    )
    if "repeat_difference_pct" in summary:
        print(
            f"noise floor: the first configuration, run again at the end, differed by "
            f"{summary['repeat_difference_pct']:.1f} % from its first run"
        )
    else:
        print(
            "noise floor: measured / predicted of one configuration varied over the repeats "
            f"by {summary['repeat_spread_pct_median']:.1f} % (median over configurations)"
        )


if __name__ == "__main__":
    sys.exit(main())
