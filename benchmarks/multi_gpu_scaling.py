"""Published data-parallel LoRA runs on 2-8 GPUs against the time model's N-GPU step.

On N GPUs the time model gives each GPU 1/N of the steps and adds, per optimizer step, the
all-reduce of the adapter's gradients and the wait for the slowest GPU: E[max of N standard
normals] x the sd of a step (`analysis.timemodel.interconnect`). With the step's relative sd
k, a run on N takes T1 / N x (1 + k x E[max of N]) (the all-reduce of a LoRA adapter, a few
ms against steps of seconds, is left out here: none of the sources gives its steps).

The published tables (`benchmarks/data/published_ddp_scaling.json`, sources there) give the
same setup on 1 GPU and on several, so they check two things without a model of the GPU:
- `from 2 GPUs`: k read off a series' 2-GPU row predicts its 4- and 8-GPU rows (held out),
  the case of a study whose one-GPU trials measured the spread of their steps;
- `other series`: k taken from the other series of the same source (leave one series out:
  their mean, and Student's 80 % predictive interval over them as the band) predicts every
  multi-GPU row of the series left out, the case of a plan that knows the setup but not
  this model or GPU.

    python benchmarks/multi_gpu_scaling.py --json hpo-runs/multi-gpu-scaling.json
    python benchmarks/multi_gpu_scaling.py --smoke
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import t as student_t

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.timemodel.interconnect import expected_max_normal  # noqa: E402
from benchmarks._common import table, write_json  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "published_ddp_scaling.json"


def seconds_by_gpus(series: dict[str, Any]) -> dict[int, float]:
    """A series' time for one fixed amount of work, by GPU count (samples/s -> 1/rate)."""
    if "seconds" in series:
        return {int(n): float(s) for n, s in series["seconds"].items()}
    return {int(n): 1.0 / float(r) for n, r in series["samples_per_second"].items()}


def spread_of(one: float, many: float, gpus: int) -> float:
    """The step's relative sd k that makes `many` = one / N x (1 + k E[max of N])."""
    return (many * gpus / one - 1.0) / expected_max_normal(gpus)


def predicted(one: float, gpus: int, k: float) -> float:
    return one / gpus * (1.0 + k * expected_max_normal(gpus))


def name(series: dict[str, Any]) -> str:
    return f"{series['source']} {series['model']} {series['base']} {series['gpu']}"


def evaluate(data: dict[str, Any]) -> dict[str, Any]:
    usable = [s for s in data["series"] if "note" not in s]
    rows: list[dict[str, Any]] = []
    for series in usable:
        times = seconds_by_gpus(series)
        one = times[1]
        own_k = spread_of(one, times[2], 2) if 2 in times else None
        # One k per other series (the mean over its GPU counts): a new series is one draw
        # of them, so its band is Student's predictive interval over a few draws.
        others = [
            float(np.mean([spread_of(times_o[1], t, n) for n, t in times_o.items() if n > 1]))
            for o in usable
            if o is not series and o["source"] == series["source"]
            for times_o in [seconds_by_gpus(o)]
        ]
        k50 = float(np.mean(others))
        half = float(
            student_t.ppf(0.9, len(others) - 1)
            * np.std(others, ddof=1)
            * math.sqrt(1 + 1 / len(others))
        )
        k10, k90 = k50 - half, k50 + half
        for gpus, measured in sorted(times.items()):
            if gpus == 1:
                continue
            row: dict[str, Any] = {
                "series": name(series),
                "gpus": gpus,
                "measured_seconds": measured,
                "efficiency": one / (gpus * measured),
                "k": spread_of(one, measured, gpus),
                "others_p50": predicted(one, gpus, k50),
                "others_p10": predicted(one, gpus, k10),
                "others_p90": predicted(one, gpus, k90),
            }
            row["others_error"] = row["others_p50"] / measured - 1.0
            row["others_inside"] = row["others_p10"] <= measured <= row["others_p90"]
            row["others_half_width"] = (row["others_p90"] - row["others_p10"]) / (2 * measured)
            if own_k is not None and gpus > 2:
                row["from_2_gpus"] = predicted(one, gpus, own_k)
                row["from_2_gpus_error"] = row["from_2_gpus"] / measured - 1.0
            rows.append(row)
    held = [r for r in rows if "from_2_gpus_error" in r]
    summary = {
        "rows": len(rows),
        "from_2_gpus_rows": len(held),
        "from_2_gpus_median_abs_error": _median([abs(r["from_2_gpus_error"]) for r in held]),
        "from_2_gpus_max_abs_error": max((abs(r["from_2_gpus_error"]) for r in held), default=0),
        "others_inside": sum(r["others_inside"] for r in rows) / max(len(rows), 1),
        "others_median_abs_error": _median([abs(r["others_error"]) for r in rows]),
        "others_median_half_width": _median([r["others_half_width"] for r in rows]),
        "left_out": [name(s) + ": " + s["note"] for s in data["series"] if "note" in s],
    }
    return {"rows": rows, "summary": summary}


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else math.nan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DATA), help="the published series (JSON)")
    parser.add_argument("--json", help="write the rows and the summary here")
    parser.add_argument(
        "--smoke", action="store_true", help="two series of each source only (seconds)"
    )
    args = parser.parse_args(argv)
    data = json.loads(Path(args.data).read_text(encoding="utf-8"))
    if args.smoke:
        kept: dict[str, int] = {}
        series = []
        for s in data["series"]:
            if "note" in s or kept.get(s["source"], 0) < 3:
                kept[s["source"]] = kept.get(s["source"], 0) + ("note" not in s)
                series.append(s)
        data = {**data, "series": series}
    result = evaluate(data)
    print(
        table(
            ["series", "N", "eff", "k", "from 2 GPUs", "others p50", "p10-p90 holds"],
            [
                [
                    r["series"],
                    r["gpus"],
                    f"{r['efficiency']:.2f}",
                    f"{r['k']:.3f}",
                    f"{100 * r['from_2_gpus_error']:+.1f}%" if "from_2_gpus_error" in r else "-",
                    f"{100 * r['others_error']:+.1f}%",
                    f"{'yes' if r['others_inside'] else 'no'} (±{100 * r['others_half_width']:.0f}%)",
                ]
                for r in result["rows"]
            ],
        )  # fmt: skip
    )
    s = result["summary"]
    print(
        f"\nfrom 2 GPUs: {s['from_2_gpus_rows']} held-out rows, median |error| "
        f"{100 * s['from_2_gpus_median_abs_error']:.1f}%, max {100 * s['from_2_gpus_max_abs_error']:.1f}%"
    )
    print(
        f"other series: {100 * s['others_inside']:.0f}% of {s['rows']} rows inside p10-p90, "
        f"median |error| {100 * s['others_median_abs_error']:.1f}%, median half-width "
        f"{100 * s['others_median_half_width']:.1f}%"
    )
    for line in s["left_out"]:
        print(f"left out: {line}")
    write_json(args.json, {"benchmark": "multi_gpu_scaling", "data": str(args.data), **result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
