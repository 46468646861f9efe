"""Lease part 5 (what time is left): the time model calibrated by the probe design on this GPU,
then held-out runs it never saw, as `benchmarks/gpu_check.py` runs them after the refit that
added a step at a new length (`new_shape_seconds`).

The calibration is recorded as soon as the probes end, and each held-out run as soon as it
ends, so a part cut short by the deadline keeps what it measured. The probes take at most
half of the time left, and each held-out run is sized to what is left after them (at most
5 x the longest probe, at least 2 typical probes, else it is skipped). What the probes and the
held-out runs measured is written too (`time_model_raw.json`), so that
`python -m benchmarks.time_model_refit` can refit offline what a lease measured.

    python -m benchmarks.lease.time_model --out time_model.json --work DIR [--smoke]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks._common import median  # noqa: E402
from benchmarks.lease.part import start  # noqa: E402
from common.cli import run_cli  # noqa: E402
from common.files import write_json  # noqa: E402

HELD_OUT_RUNS, SMOKE_HELD_OUT_RUNS = 3, 2
HOLDOUT_FACTOR, SMOKE_HOLDOUT_FACTOR = 5.0, 1.5  # held-out runs x the longest probe
# The part gets what the others left (often under a minute on a GPU). On the H100 of
# 2026-11-24 the five probes took 55 s (12.7 s the first, with CUDA's start) and three
# held-out runs sized at 5 x the longest probe 56-77 s each
# (docs/measurements/gpu-time-model-h100.json): at the study's own 60 s of probes no
# held-out run would ever start. So the probes get half of what is left, and each held-out
# run what is left after them (a run is still as long as two typical probes).
PROBE_SHARE = 0.5
MIN_PROBE_SECONDS = 20.0  # three probes run whatever the budget: below this, none starts
MIN_HELD_OUT_PROBES = 2.0  # a held-out run predicted shorter than 2 median probes: skipped
OVERRUN = 1.5  # a run may take this x its prediction (the machine's drift, the band's p90)


def held_out_seconds(left: float, longest: float, median: float, factor: float) -> float | None:
    """How long a held-out run is sized to: `factor` x the longest probe, or what is left;
    None where what is left holds less than that or 2 typical probes, the shorter."""
    wanted = factor * longest
    if left / OVERRUN < min(wanted, MIN_HELD_OUT_PROBES * median):
        return None
    return min(wanted, left / OVERRUN)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    from benchmarks.time_model_accuracy import reserved_above_bound_fraction

    return {
        "median_abs_pct_error": median([r["abs_pct_error"] for r in rows]),
        "band_coverage": sum(r["inside_band"] for r in rows) / len(rows),
        "memory_median_abs_pct_error": median([r["memory_abs_pct_error"] for r in rows]),
        "memory_above_p90_fraction": sum(r["memory_above_p90"] for r in rows) / len(rows),
        "reserved_above_bound_fraction": reserved_above_bound_fraction(rows),
    }


def main(argv: list[str] | None = None) -> int:
    args, record, work = start("time_model", __doc__, argv)
    from analysis.calibrate import PROBE_BUDGET_SECONDS, PROBE_DESIGN
    from benchmarks._held_out import HELD_OUT, calibrate, synthetic_data
    from benchmarks.gpu_check import GPU_DIMS, SMOKE_DIMS, build_model
    from benchmarks.time_model_accuracy import held_out_row
    from benchmarks.time_model_refit import raw_payload
    model = work / "models" / "study-llama"  # the study part's model, when it ran
    if not (model / "config.json").is_file():
        build_model(model, SMOKE_DIMS if args.smoke else GPU_DIMS)
    data = str(synthetic_data(work / "time-model-data.jsonl"))
    raw = Path(args.out).with_name("time_model_raw.json")
    if record.left() < MIN_PROBE_SECONDS:
        record.skip(f"the probes: {record.left():.0f} s left")
        record.finish()
        return 0
    probes = calibrate(str(model), data, work / "time-model",
                       PROBE_DESIGN[:4] if args.smoke else PROBE_DESIGN,
                       budget_seconds=min(PROBE_BUDGET_SECONDS, PROBE_SHARE * record.left()))  # fmt: skip
    for key in ("runs", "seconds", "median_seconds", "longest_seconds"):
        record.set(f"probe_{key}", probes[key])
    record.set("calibration", probes["calibration"].coefficients.to_dict())
    write_json(raw, raw_payload(probes["hardware"], probes["results"], []))
    factor = SMOKE_HOLDOUT_FACTOR if args.smoke else HOLDOUT_FACTOR
    rows: list[dict[str, Any]] = []
    for index, config in enumerate(
        HELD_OUT[: SMOKE_HELD_OUT_RUNS if args.smoke else HELD_OUT_RUNS]
    ):
        longest = probes["longest_seconds"]
        seconds = held_out_seconds(record.left(), longest, probes["median_seconds"], factor)
        if seconds is None:
            record.skip(f"held-out {config.name}: {record.left():.0f} s left")
            continue
        rows.append(held_out_row(str(model), data, work / "time-model", probes, index, config,
                                 seconds / longest))  # fmt: skip
        write_json(raw, raw_payload(probes["hardware"], probes["results"], rows))
        record.append("rows", {k: v for k, v in rows[-1].items() if k != "result"})
        for key, value in summary(record.data["rows"]).items():
            record.set(key, value)
    record.set("raw", raw.name)
    record.finish()
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
