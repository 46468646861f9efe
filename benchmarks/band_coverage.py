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

A second table asks how far the level could go with what the full runs themselves say
(`calibration_bounds`): the reference-only end predictions of each set and fraction,
recalibrated on that set's full runs by rules a study could only follow once they reported
back, down to two that no study can (every full run, the predicted one's own included: the
set's bias removed, or a line through them all).
Per rule: the median and 80th percentile of |error|, the rows (set x fraction) whose median
is within 10 % and 5 %, and the half-width a p10-p90 band centred on it would need to hold
80 % of the full runs.
Nothing is trained: about a minute on 2 cores.

    python benchmarks/band_coverage.py [FILE ...] [--fractions 0.01,0.02,0.03] [--json out.json]
        [--smoke]
"""

from __future__ import annotations

import argparse
import json
import math
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
REFERENCE_ONLY = "reference run only"
SMOKE_SETS = (
    "rank-fidelity-fresh-pc-2026-11-24.json",
    "rank-fidelity-fresh-pc-3k-noise0.3-seed1-2026-11-25.json",
)


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
            out[REFERENCE_ONLY] = rank_fidelity.end_predictions(during, attrs, reference)
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


def _least_squares_prediction(
    features: list[np.ndarray], target: np.ndarray, fit_on: np.ndarray, at: np.ndarray
) -> np.ndarray:
    """`target` regressed on an intercept and `features` over the rows `fit_on`, predicted at
    the rows `at`."""
    design = np.column_stack([np.ones(len(target)), *features])
    coef, *_ = np.linalg.lstsq(design[fit_on], target[fit_on], rcond=None)
    return np.asarray(design[at] @ coef)


def _leave_one_out(features: list[np.ndarray], target: np.ndarray) -> np.ndarray:
    """Each row predicted from a regression on every other row."""
    rows = np.arange(len(target))
    return np.array(
        [_least_squares_prediction(features, target, rows != i, rows == i)[0] for i in rows]
    )


# Rules that recalibrate a set's log p50 from its full runs' measured losses, from what a
# study can do once full runs report back to what none can (the predicted run's own loss).
CALIBRATIONS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "none (the p50)": lambda full, p50, last: p50,
    "the other full runs' median ratio": lambda full, p50, last: np.array(
        [p50[i] + np.median(np.delete(full - p50, i)) for i in range(len(full))]
    ),
    "the other full runs, regressed on log last loss (no law)": lambda full, p50, last: (
        _leave_one_out([last], full)
    ),
    "the other full runs, regressed on log p50 and log last loss": lambda full, p50, last: (
        _leave_one_out([p50, last], full)
    ),
    "every full run, its own too: their median ratio": lambda full, p50, last: (
        p50 + np.median(full - p50)
    ),
    "every full run, its own too, regressed on log p50": lambda full, p50, last: (
        _least_squares_prediction([p50], full, np.ones(len(full), bool), np.ones(len(full), bool))
    ),
}


def calibration_bounds(groups: list[list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """How close each of `CALIBRATIONS` brings the p50 to the full runs.

    Args:
        groups: One set's predictions at one trial fraction each (a study's configurations:
            `full_run_loss`, `p50` and `loss_at_fidelity`, all > 0); at least 3 a group.

    Returns:
        Per rule: `median_abs_pct_error`, `p80_abs_pct_error`, `rows_within_10_pct` and
        `rows_within_5_pct` (groups whose median |error| is), `rows`, and
        `halfwidth_for_80_pct` (100 sinh(q), q the least value with 80 % of |ln(full / p)|
        at or below it: the half-width of the band p exp(+-q), which holds them).
    """
    out: dict[str, dict[str, float]] = {}
    for name, rule in CALIBRATIONS.items():
        log_errors: list[float] = []
        row_medians: list[float] = []
        for group in groups:
            full, p50, last = (
                np.log([p[k] for p in group]) for k in ("full_run_loss", "p50", "loss_at_fidelity")
            )
            log_error = rule(full, p50, last) - full
            log_errors.extend(log_error)
            row_medians.append(float(np.median(np.abs(np.expm1(log_error)))) * 100)
        errors = np.abs(np.expm1(np.array(log_errors))) * 100
        # The least q with 80 % of the |log errors| at or below it.
        q80 = float(np.quantile(np.abs(np.array(log_errors)), 0.8, method="inverted_cdf"))
        out[name] = {
            "median_abs_pct_error": float(np.median(errors)),
            "p80_abs_pct_error": float(np.percentile(errors, 80)),
            "rows": len(groups),
            "rows_within_10_pct": sum(m <= 10 for m in row_medians),
            "rows_within_5_pct": sum(m <= 5 for m in row_medians),
            "halfwidth_for_80_pct": 100 * math.sinh(q80),
        }
    return out


def measure(
    paths: list[Path], fractions: list[str], *, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Every case pooled over `paths` and `fractions` (a set: one file, its fractions together),
    and the calibration bounds of the reference-only case (`"bounds"`)."""
    cases: dict[str, dict[str, list[dict[str, Any]]]] = {}
    groups: list[list[dict[str, Any]]] = []
    for path in paths:
        payload = json.loads(path.read_text(encoding="utf-8"))
        if not payload.get("rows") or "trials" not in payload["rows"][0]:
            log(f"skipped {path.name}: not a recorded rank_fidelity set")
            continue
        for fraction in fractions:
            for case, preds in set_predictions(payload, fraction).items():
                cases.setdefault(case, {}).setdefault(path.stem, []).extend(preds)
                if case == REFERENCE_ONLY:
                    groups.append(preds)
        log(f"scored {path.name}")
    scores: dict[str, Any] = {case: pooled(by_set) for case, by_set in cases.items()}
    if groups:
        scores["bounds"] = calibration_bounds(groups)
    return scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="recorded rank_fidelity sets")
    parser.add_argument("--fractions", default="0.01,0.02,0.03")
    parser.add_argument("--json", help="write the pooled scores here")
    parser.add_argument(
        "--smoke", action="store_true", help="two recorded sets at one fraction: the suite runs it"
    )
    args = parser.parse_args(argv)
    if args.smoke:  # one held-out set (seed1), one not: both coverage columns are filled
        args.files = [RECORDED / name for name in SMOKE_SETS]
        args.fractions = "0.02"
    paths = args.files or sorted(RECORDED.glob("rank-fidelity-*.json"))
    if not paths:
        parser.error(f"no recorded sets given and none in {RECORDED}")
    fractions = [f.strip() for f in args.fractions.split(",") if f.strip()]
    scores = measure(paths, fractions)
    bounds = scores.pop("bounds", {})
    head = ["case", "predictions", "sets", "median err %", "p90 err %", "inside p10-p90",
            "held-out sets", "lowest set", "sets < 80 %", "median half-width %"]  # fmt: skip
    keys = ["predictions", "sets", "median_abs_pct_error", "p90_abs_pct_error",
            "band_coverage", "band_coverage_held_out", "lowest_set_coverage",
            "sets_below_target", "median_band_halfwidth_pct"]  # fmt: skip
    print(table(head, [[case, *(s[k] for k in keys)] for case, s in scores.items()]))
    if bounds:
        print(f"\n{REFERENCE_ONLY}, recalibrated on the set's full runs:")
        head = ["calibration", "median err %", "p80 err %", "rows <= 10 %", "rows <= 5 %",
                "rows", "half-width for 80 % inside"]  # fmt: skip
        keys = ["median_abs_pct_error", "p80_abs_pct_error", "rows_within_10_pct",
                "rows_within_5_pct", "rows", "halfwidth_for_80_pct"]  # fmt: skip
        print(table(head, [[name, *(b[k] for k in keys)] for name, b in bounds.items()]))
    write_results(args.json, {"files": [p.name for p in paths], "fractions": fractions,
                              "reference_fraction": REFERENCE_FRACTION, "scores": scores,
                              "bounds": bounds})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
