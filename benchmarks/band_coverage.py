"""Does the band a study promises hold what it says, pooled over every recorded study?

`rank_fidelity.py --rescore FILE` scores one recorded set at a time, 8 predictions a row:
one miss moves a row's coverage by 12.5 points. This pools them. On every set it recorded
(`docs/measurements/rank-fidelity-*.json`), each configuration's end prediction (what the
study's summary and preset carry: `hpo.final_loss.study_prediction`, uncorrected) is made
again at each trial fraction with the reference run at `--reference-fraction`, in the cases
a user meets:

* `reference run only`: a new study, before any full run reported back;
* `+ the pick's full run` / `+ 7 full runs`: once the study's best other configuration's
  full run (or all 7 others) reported back, their curves among the shape curves (never the
  configuration's own; sets whose recording holds the full runs' curves only);
* the same two without the reference run (`--reference-fraction 0`).

Per case, pooled over sets: predictions, the median and p90 |error| of the p50, the share
of full runs inside p10-p90 (all sets, and the held-out ones alone: recorded with `--seed`
1 or more, `seed<N>` in their file name, on which no choice was made), the lowest
share of any one set (its fractions together: 24 predictions) and how many sets fall below
80 %, and the median band half-width.
Nothing is trained: about a minute on 2 cores.

    python benchmarks/band_coverage.py [FILE ...] [--fractions 0.01,0.02,0.03] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import rank_fidelity  # noqa: E402
from benchmarks._common import table, write_results  # noqa: E402

RECORDED = Path(__file__).resolve().parent.parent / "docs" / "measurements"
REFERENCE_FRACTION = 0.3
TARGET_COVERAGE = 0.8  # the band is p10-p90


def set_predictions(payload: dict[str, Any], fraction: str) -> dict[str, list[dict[str, Any]]]:
    """One recorded set's end predictions at one trial fraction, by case."""
    rows = payload["rows"]
    references = [
        r
        for r in payload.get("references", {}).get(fraction, [])
        if abs(r["fraction"] - REFERENCE_FRACTION) < 1e-9
    ]
    if fraction not in rows[0]["trials"] or not references:
        return {}
    curves = all("full_run_curve" in r for r in rows)
    out: dict[str, list[dict[str, Any]]] = {}
    for reference, label in ((references[0], "reference run"), (None, "no reference")):
        attrs: list[dict[str, Any]] = []
        during = rank_fidelity.predictions(rows, fraction, reference, attrs=attrs)
        if reference is not None:
            out["reference run only"] = rank_fidelity.end_predictions(during, attrs, reference)
        if not curves:
            continue
        for runs, name in ((1, "the pick's full run"), (len(rows) - 1, "7 full runs")):
            known = rank_fidelity.with_full_runs(rows, during, attrs, reference, runs=runs)
            out[f"{label} + {name}"] = known
    return out


def pooled(by_set: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Error, coverage and width of one case's predictions, pooled over sets."""
    inside: dict[str, list[bool]] = {
        name: [p["p10"] <= p["full_run_loss"] <= p["p90"] for p in preds]
        for name, preds in by_set.items()
    }
    preds = [p for ps in by_set.values() for p in ps]
    full = np.array([p["full_run_loss"] for p in preds])
    p10, p50, p90 = (np.array([p[k] for p in preds]) for k in ("p10", "p50", "p90"))
    error = np.abs(p50 / full - 1) * 100
    held_out = [ok for name, oks in inside.items() if re.search(r"seed[1-9]", name) for ok in oks]
    per_set = [float(np.mean(oks)) for oks in inside.values()]
    return {
        "predictions": len(preds),
        "sets": len(by_set),
        "median_abs_pct_error": float(np.median(error)),
        "p90_abs_pct_error": float(np.percentile(error, 90)),
        "band_coverage": float(np.mean((p10 <= full) & (full <= p90))),
        "band_coverage_held_out": float(np.mean(held_out)) if held_out else float("nan"),
        "lowest_set_coverage": min(per_set),
        "sets_below_target": sum(c < TARGET_COVERAGE for c in per_set),
        "median_band_halfwidth_pct": float(np.median((p90 - p10) / 2 / p50 * 100)),
    }


def measure(
    paths: list[Path], fractions: list[str], *, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Every case pooled over `paths` and `fractions` (a set: one file, its fractions together)."""
    cases: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for path in paths:
        payload = json.loads(path.read_text(encoding="utf-8"))
        for fraction in fractions:
            for case, preds in set_predictions(payload, fraction).items():
                cases.setdefault(case, {}).setdefault(path.stem, []).extend(preds)
        log(f"scored {path.name}")
    return {case: pooled(by_set) for case, by_set in cases.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="recorded rank_fidelity sets")
    parser.add_argument("--fractions", default="0.01,0.02,0.03")
    parser.add_argument("--json", help="write the pooled scores here")
    args = parser.parse_args(argv)
    paths = args.files or sorted(RECORDED.glob("rank-fidelity-*.json"))
    if not paths:
        parser.error(f"no recorded sets given and none in {RECORDED}")
    fractions = [f.strip() for f in args.fractions.split(",") if f.strip()]
    scores = measure(paths, fractions)
    head = ["case", "predictions", "sets", "median err %", "p90 err %", "inside p10-p90",
            "held-out sets", "lowest set", "sets < 80 %", "median half-width %"]  # fmt: skip
    keys = ["predictions", "sets", "median_abs_pct_error", "p90_abs_pct_error",
            "band_coverage", "band_coverage_held_out", "lowest_set_coverage",
            "sets_below_target", "median_band_halfwidth_pct"]  # fmt: skip
    print(table(head, [[case, *(s[k] for k in keys)] for case, s in scores.items()]))
    write_results(args.json, {"files": [p.name for p in paths], "fractions": fractions,
                              "reference_fraction": REFERENCE_FRACTION, "scores": scores})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
