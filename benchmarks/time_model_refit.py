"""Refit the time model on measured runs, offline: `python -m benchmarks.time_model_refit RAW`.

`gpu_check.py --raw FILE` and `time_model_accuracy.py --raw FILE` store what their probe
design and held-out runs measured (the trainer's result dicts and the machine). This replays
the protocol without the machine: it calibrates from the stored probes with the fit as it is
now and with the steps at new padded lengths fitted together with the rest (the fit before
`new_shape_seconds`), predicts each held-out run and compares with what it measured. A GPU
measurement, which costs device time, is then evaluated again after any change to the fit.
The held-out runs' token lengths are rebuilt from the benchmark's own synthetic data and
the tiny tokenizer (both deterministic), so no model weights are needed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.calibration import fit as fit_module  # noqa: E402
from analysis.timemodel.hardware import HardwareInfo  # noqa: E402
from benchmarks._common import median, table, write_json  # noqa: E402
from common.cli import run_cli  # noqa: E402
from common.errors import BadInputError  # noqa: E402

FITS = ("new lengths apart", "fitted together")
SMOKE_RAW = Path(__file__).resolve().parent.parent / "docs/measurements/gpu-time-model-h100.json"


def raw_payload(
    hardware: HardwareInfo, probes: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """What `--raw` stores: the machine, the probes' results and each held-out run's."""
    return {
        "hardware": dataclasses.asdict(hardware),
        "probes": probes,
        "held_out": [
            {"config": r["config"], "steps": r["optimizer_steps"], "result": r["result"]}
            for r in rows
        ],
    }


@contextmanager
def _fitted_together() -> Iterator[None]:
    """The fit before new padded lengths were fitted apart: no run ever splits."""
    saved = fit_module.MIN_REPEATED_SHARE
    fit_module.MIN_REPEATED_SHARE = float("inf")
    try:
        yield
    finally:
        fit_module.MIN_REPEATED_SHARE = saved


def refit(raw: dict[str, Any], work: Path) -> list[dict[str, Any]]:
    """One row per held-out run and fit: predicted p10/p50/p90 against measured."""
    from analysis.calibrate import calibrate_from_results
    from analysis.planning.fits import plan_of_spec
    from analysis.timemodel.model import predict
    from benchmarks._held_out import HELD_OUT, held_out_spec, lengths_of, synthetic_data
    from trainers.tiny import build_tokenizer

    hardware = HardwareInfo(**raw["hardware"])
    by_name = {config.name: config for config in HELD_OUT}
    tokenizer_dir = work / "tokenizer"
    build_tokenizer().save_pretrained(tokenizer_dir)
    data = str(synthetic_data(work / "data.jsonl"))
    rows = []
    for name in FITS:
        if name == "fitted together":
            with _fitted_together():
                calibration = calibrate_from_results(raw["probes"], hardware)
        else:
            calibration = calibrate_from_results(raw["probes"], hardware)
        for index, held in enumerate(raw["held_out"]):
            if held["config"] not in by_name:
                raise BadInputError(f"unknown held-out configuration {held['config']!r}")
            spec = held_out_spec(str(tokenizer_dir), data, by_name[held["config"]], work,
                                 f"held-out-{index}", steps=int(held["steps"]))  # fmt: skip
            lengths, n_validation = lengths_of(spec)
            plan = plan_of_spec(spec, calibration.model, lengths, n_validation=n_validation,
                                hardware=hardware)  # fmt: skip
            estimate = predict(plan, calibration.coefficients)
            measured = float(held["result"]["wall_seconds"])
            rows.append({
                "fit": name, "config": held["config"], "measured_s": measured,
                "predicted_p10_s": estimate.seconds_p10, "predicted_p50_s": estimate.seconds_p50,
                "predicted_p90_s": estimate.seconds_p90,
                "pct_error": 100 * (estimate.seconds_p50 / measured - 1),
                "inside_band": estimate.seconds_p10 <= measured <= estimate.seconds_p90,
                "new_shape_seconds": calibration.coefficients.new_shape_seconds,
                "step_mean_ratio": calibration.coefficients.step_mean_ratio,
            })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.time_model_refit",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument(
        "raw", nargs="?", help="a file written by gpu_check.py or time_model_accuracy.py --raw"
    )
    parser.add_argument("--json", help="write the rows and the summary to this JSON file")
    parser.add_argument(
        "--smoke", action="store_true", help=f"refit {SMOKE_RAW.name}: the suite runs it"
    )
    args = parser.parse_args(argv)
    if args.smoke:  # the whole refit already takes seconds: the smoke picks a recorded file
        args.raw = args.raw or str(SMOKE_RAW)
    if args.raw is None:
        parser.error("a --raw file of measured runs is needed (or --smoke)")
    try:
        raw = json.loads(Path(args.raw).read_text(encoding="utf-8"))
        raw["hardware"], raw["probes"], raw["held_out"]  # noqa: B018 (the fields it needs)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInputError(f"{args.raw}: not a --raw file of measured runs ({exc})") from exc
    with tempfile.TemporaryDirectory(prefix="time-model-refit-") as tmp:
        rows = refit(raw, Path(tmp))
    print(table(
        ["fit", "config", "measured s", "p10 / p50 / p90 s", "error %", "inside"],
        [[r["fit"], r["config"], round(r["measured_s"], 1),
          f"{r['predicted_p10_s']:.1f} / {r['predicted_p50_s']:.1f} / {r['predicted_p90_s']:.1f}",
          round(r["pct_error"], 1), "yes" if r["inside_band"] else "no"] for r in rows],
    ))  # fmt: skip
    summary = {}
    for name in FITS:
        mine = [r for r in rows if r["fit"] == name]
        summary[name] = {
            "median_abs_pct_error": median([abs(r["pct_error"]) for r in mine]),
            "band_coverage": sum(r["inside_band"] for r in mine) / len(mine),
            "new_shape_seconds": mine[0]["new_shape_seconds"],
            "step_mean_ratio": mine[0]["step_mean_ratio"],
        }
        s = summary[name]
        print(f"{name}: median |error| {s['median_abs_pct_error']:.1f} %, inside p10-p90 "
              f"{100 * s['band_coverage']:.0f} %, new length {s['new_shape_seconds']:.3f} s, "
              f"mean/typical step {s['step_mean_ratio']:.2f}")  # fmt: skip
    write_json(args.json, {"rows": rows, "summary": summary, "raw": args.raw})
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
