"""After a GPU lease: its files kept under docs/measurements/, its scale rows added to the
rows the priors are fitted to, and what each part says to refit, in one command.

    python -m benchmarks.lease.ingest LEASE_OUT [--date YYYY-MM-DD] [--replace]

LEASE_OUT is the folder `benchmarks/gpu_lease.py --out` wrote (the device tool's `files_at`).
It does, on the CPU, what docs/benchmarks/gpu_lease.md lists for after a lease:

1. copies every file of LEASE_OUT to `docs/measurements/gpu-lease-<gpu>-<date>/`;
2. writes the scale part's rows as one group, `analysis/priors/measured/lease-<gpu>-<date>.json`,
   which `analysis.priors.published_runs` loads beside the published groups: the 16-bit rows
   of Mistral-7B are fitted; TinyLlama's and every NF4 row are held out (a second model size,
   and the 4-bit factor, which is a constant the fit does not touch, are what they check);
3. prints, and writes to `ingest.json` beside the copies, what the other constants should be:
   `NF4_STEP_FACTOR` (the median 4-bit / 16-bit step ratio of Mistral's pairs, TinyLlama's
   pair as its check), `LEVER_STEP_FACTOR` and `MEASURED_FASTER` (a lever faster at equal
   loss by at least `MIN_SPEEDUP`), and the varied-length share the allocator row measured;
   then the commands that refit.

It edits no constant itself: each is a decision the note of the session that ran the lease
explains. A smoke lease (CPU, tiny sizes) is refused: it measured nothing of a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks._common import table  # noqa: E402
from common.cli import check_writable_dir, run_cli  # noqa: E402
from common.errors import BadInputError  # noqa: E402
from common.files import write_json  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MEASURED = REPO / "analysis" / "priors" / "measured"
DOCS = REPO / "docs" / "measurements"
FITTED_MODEL = "mistral-7b-v0.1"  # its 16-bit rows join the fit; the rest are held out
# A lever's speed-up over six steps of one run each: below 3 % it is within what two runs of
# the same thing differ by on a shared machine, so it does not turn the lever on by default.
MIN_SPEEDUP = 1.03


def _read(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / name
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(f"{path}: not a lease's JSON ({exc})") from None
    if not isinstance(data, dict):
        raise BadInputError(f"{path}: not a lease's JSON (a {type(data).__name__})")
    return data


def _gpu_of(preflight: dict[str, Any] | None) -> str:
    """The plan's name of the lease's GPU from the preflight (when the scale part wrote none)."""
    from analysis.timemodel.gpus import KNOWN_GPUS

    name = (preflight or {}).get("device", {}).get("name")
    return next((g.name for g in KNOWN_GPUS if g.device_name == name), "gpu")


def lease_date(lease: dict[str, Any], folder: Path) -> str:
    """The lease's UTC date (`lease.json` has it since 2026-11-27; else its file's time)."""
    if isinstance(lease.get("date"), str):
        return lease["date"]
    seconds = (folder / "lease.json").stat().st_mtime
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).date().isoformat()


def measured_group(scale: dict[str, Any], preflight: dict[str, Any] | None,
                   source: str, date: str) -> dict[str, Any]:  # fmt: skip
    """The scale part's measured rows as a group of `published_runs` rows (failed rows left
    out), each made as the scale part's own replay made it (`gpu_scale.as_row`)."""
    from benchmarks.gpu_scale import Setup, as_row

    gpu = scale["gpu"]
    versions = (preflight or {}).get("versions", {})
    device = (preflight or {}).get("device", {}).get("name", gpu)
    notes = ", ".join(f"{name} {version}" for name, version in versions.items()
                      if name in ("torch", "transformers", "peft", "bitsandbytes") and version)  # fmt: skip
    fields = [f.name for f in dataclasses.fields(Setup)]
    runs = []
    for i, row in enumerate(scale.get("rows", [])):
        if "error" in row or not row.get("seconds_per_step") or not row.get("reserved_gib"):
            continue
        run = dataclasses.replace(
            as_row(row["model"], gpu, Setup(**{k: row[k] for k in fields}), row, "reserved"),
            name=f"lease {row['model']} {row['setup']}, {gpu}", source=f"{source}/scale.json",
            where=f"{source}/scale.json, rows[{i}]", notes=f"{device}; {notes}",
            held_out=row["model"] != FITTED_MODEL or row["quantization"] != "none",
        )  # fmt: skip
        runs.append(dataclasses.asdict(run))
    return {
        "what": (f"measured by this project's GPU lease on {date} (benchmarks/gpu_lease.py, part "
                 f"scale): the trainer as users run it, LoRA r16 on every linear layer, rows "
                 f"packed; held out: every row but {FITTED_MODEL}'s 16-bit ones"),
        "common": {},
        "runs": runs,
    }  # fmt: skip


def nf4_ratios(scale: dict[str, Any]) -> list[dict[str, Any]]:
    """Each 4-bit row's step over the 16-bit row of the same model and shape."""

    def shape(row: dict[str, Any]) -> tuple:
        return (row["model"], row["micro_batch_size"], row["gradient_accumulation_steps"],
                row["max_length"], row["gradient_checkpointing"])  # fmt: skip

    rows = [r for r in scale.get("rows", []) if "error" not in r and r.get("seconds_per_step")]
    sixteen = {shape(r): r for r in rows if r["quantization"] == "none"}
    return [
        {"model": r["model"], "setup": r["setup"],
         "ratio": r["seconds_per_step"] / sixteen[shape(r)]["seconds_per_step"],
         "fitted": r["model"] == FITTED_MODEL}
        for r in rows if r["quantization"] == "nf4" and shape(r) in sixteen
    ]  # fmt: skip


def lever_findings(levers: dict[str, Any]) -> list[dict[str, Any]]:
    """Each measured pair: its speed-up, the step factor it implies, and whether it turns on."""
    found = []
    for row in levers.get("rows", []):
        if "speedup" not in row:
            continue
        on = bool(row.get("equal_loss")) and row["speedup"] >= MIN_SPEEDUP
        found.append({"lever": row["lever"], "setup": row.get("setup"),
                      "speedup": row["speedup"], "equal_loss": row.get("equal_loss"),
                      "step_factor": 1.0 / row["speedup"], "measured_faster": on})  # fmt: skip
    return found


def varied_length_share(levers: dict[str, Any]) -> dict[str, Any] | None:
    """The allocator row: the share of (activations + logits) the caching allocator kept when
    lengths varied, against the plan's whole-rows peak and against expandable segments."""
    for row in levers.get("rows", []):
        whole, varied = row.get("plan_whole_rows"), row.get("plan_lengths_vary")
        if not (isinstance(whole, dict) and isinstance(varied, dict)):
            continue
        default = row.get("default", {})
        parts = whole["parts_gib"]
        base = parts["activations"] + parts["logits"]
        out: dict[str, Any] = {
            "reserved_gib": default.get("reserved_gib"),
            "plan_p50_whole_rows_gib": whole["reserved_p50_gib"],
            "plan_p50_lengths_vary_gib": varied["reserved_p50_gib"],
            "plan_p90_lengths_vary_gib": varied["reserved_p90_gib"],
            "share_fitted": varied["parts_gib"]["varied_length_reserve"] / base,
        }
        if default.get("reserved_gib"):
            out["share_against_plan"] = (default["reserved_gib"] - whole["reserved_p50_gib"]) / base
            out["held_by_p90"] = default["reserved_gib"] <= varied["reserved_p90_gib"]
        expandable = row.get("expandable")
        if isinstance(expandable, dict) and default.get("reserved_gib"):
            out["expandable_reserved_gib"] = expandable["reserved_gib"]
            out["share_against_expandable"] = (
                default["reserved_gib"] - expandable["reserved_gib"]) / base  # fmt: skip
            out["expandable_speed_ratio"] = (expandable["tokens_per_second"]
                                             / default["tokens_per_second"])  # fmt: skip
        return out
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lease_out", help="the folder benchmarks/gpu_lease.py --out wrote")
    parser.add_argument("--date", help="the lease's UTC date (default: lease.json's)")
    parser.add_argument("--replace", action="store_true",
                        help="overwrite this lease's copies and group if they exist")  # fmt: skip
    parser.add_argument("--measurements", default=str(DOCS),
                        help="where the lease's files are kept (default: docs/measurements)")  # fmt: skip
    parser.add_argument("--into", default=str(MEASURED),
                        help="folder of measured groups (default: analysis/priors/measured)")  # fmt: skip
    args = parser.parse_args(argv)
    folder = Path(args.lease_out)
    if not folder.is_dir():
        raise BadInputError(f"{folder}: no such folder (give the folder gpu_lease.py --out wrote)")
    lease = _read(folder, "lease.json")
    if lease is None:
        raise BadInputError(
            f"{folder}: no lease.json, so not the output of benchmarks/gpu_lease.py"
        )
    if lease.get("smoke"):
        raise BadInputError(f"{folder}: a --smoke lease (the CPU at tiny sizes): nothing to fit")
    if args.date is not None:
        try:
            datetime.date.fromisoformat(args.date)
        except ValueError:
            raise BadInputError(f"--date must be YYYY-MM-DD, but got {args.date!r}") from None
    date = args.date or lease_date(lease, folder)
    preflight, scale = _read(folder, "preflight.json"), _read(folder, "scale.json")
    levers = _read(folder, "levers.json") or {}
    gpu = (scale or {}).get("gpu") or _gpu_of(preflight)
    keep = Path(args.measurements) / f"gpu-lease-{gpu.lower()}-{date}"
    group_file = Path(args.into) / f"lease-{gpu.lower()}-{date}.json"
    for target in (keep, group_file):
        if target.exists() and not args.replace and target.resolve() != folder.resolve():
            raise BadInputError(
                f"{target} exists: this lease was ingested already (--replace redoes it)"
            )
    check_writable_dir(keep, "--measurements")
    check_writable_dir(group_file.parent, "--into")

    if keep.resolve() != folder.resolve():
        keep.mkdir(parents=True, exist_ok=True)
        for path in sorted(folder.iterdir()):
            if path.is_file():
                shutil.copyfile(path, keep / path.name)
    source = keep.resolve().relative_to(REPO) if keep.resolve().is_relative_to(REPO) else keep
    report: dict[str, Any] = {"lease": str(source), "date": date, "gpu": gpu,
                              "parts": {p["part"]: p["status"] for p in lease.get("parts", [])}}  # fmt: skip
    if scale and scale.get("rows"):
        group = measured_group(scale, preflight, str(source), date)
        if group["runs"]:
            write_json(group_file, group)
            report["group"] = {"file": str(group_file), "rows": len(group["runs"]),
                               "held_out": sum(r["held_out"] for r in group["runs"])}  # fmt: skip
        ratios = nf4_ratios(scale)
        fitted = [r["ratio"] for r in ratios if r["fitted"]]
        report["nf4"] = {"pairs": ratios,
                         "step_factor": statistics.median(fitted) if fitted else None}  # fmt: skip
    if (keep / "time_model_raw.json").is_file():
        report["time_model_raw"] = str(Path(source) / "time_model_raw.json")
    report["levers"] = lever_findings(levers)
    report["varied_length"] = varied_length_share(levers)
    write_json(keep / "ingest.json", report)
    _print(report)
    return 0


def _print(report: dict[str, Any]) -> None:
    from analysis.timemodel.workload import LEVER_STEP_FACTOR, NF4_STEP_FACTOR

    print(f"lease of {report['date']} on {report['gpu']}: files kept in {report['lease']}")
    print("parts: " + ", ".join(f"{k} {v}" for k, v in report["parts"].items()))
    if "group" in report:
        g = report["group"]
        print(f"fitted rows: {g['file']} ({g['rows']} rows, {g['held_out']} held out)")
    nf4 = report.get("nf4")
    if nf4 and nf4["pairs"]:
        print(table(["4-bit pair", "setup", "step ratio", "fitted"],
                    [[p["model"], p["setup"], round(p["ratio"], 3), p["fitted"]]
                     for p in nf4["pairs"]]))  # fmt: skip
        if nf4["step_factor"]:
            print(
                f"NF4_STEP_FACTOR (analysis/timemodel/workload.py): {NF4_STEP_FACTOR} now, "
                f"{nf4['step_factor']:.3f} measured (the median of {FITTED_MODEL}'s pairs)"
            )
    if report["levers"]:
        print(table(["lever", "setup", "speed-up", "equal loss", "step factor", "turn on"],
                    [[f["lever"], f["setup"], round(f["speedup"], 3), f["equal_loss"],
                      round(f["step_factor"], 3), f["measured_faster"]]
                     for f in report["levers"]]))  # fmt: skip
        on = sorted(f["lever"] for f in report["levers"]
                    if f["measured_faster"] and f["lever"] in LEVER_STEP_FACTOR)  # fmt: skip
        print(
            f"MEASURED_FASTER (trainers/model/levers.py): {on or 'none'}; LEVER_STEP_FACTOR "
            f"(analysis/timemodel/workload.py): the step factor of each lever turned on"
        )
    varied = report.get("varied_length")
    if varied:
        print(
            "lengths vary: "
            + ", ".join(
                f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in varied.items()
            )
        )
    print("then: python -m benchmarks.published_runs --write-priors  (refits with the new rows)")
    if report.get("time_model_raw"):
        print(f"and:  python -m benchmarks.time_model_refit {report['time_model_raw']}  "
              "(the time model's probes and held-out runs, refitted offline)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(run_cli(main))
