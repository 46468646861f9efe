"""One prepared GPU lease: every part of the GPU checks in one call, each in its own process.

    python benchmarks/gpu_lease.py --out $OUT [--parts preflight,scale,study,levers,time_model]
        [--deadline-seconds 510] [--smoke]

The parts, in order, with the seconds each is given on an H100 (docs/benchmarks/gpu_lease.md
has the exact `run` call):

| part | what | module |
|---|---|---|
| preflight | versions, device, ceilings, NF4 layer, GPU metrics, SDPA kernels | benchmarks.lease.preflight |
| scale | Mistral-7B bf16 and NF4, TinyLlama-1.1B, against the plan | benchmarks.lease.scale |
| study | `hpo.study` with Optuna + MLflow, read back; --workers 2 refused | benchmarks.lease.study |
| levers | tokens/s with each speed lever against without, at equal loss; the allocator with lengths that vary | benchmarks.lease.levers |
| time_model | probe calibration, held-out runs | benchmarks.lease.time_model |

Each part runs as `python -m MODULE --out OUT/PART.json ...` under its own timeout (its
share, never past the overall deadline), and writes its JSON as it goes, so a part that
fails or is killed loses nothing it had measured and stops nothing after it. The lease's
own record (`lease.json`: each part's exit code, seconds, status) is rewritten after every
part, all output goes to `lease.log`, and a summary table is printed last. `--parts` reruns
some on a machine that is still warm. At most 8 files come back from $OUT: these 5 parts
write 6 (time_model also its raw runs), plus lease.json and lease.log.

After a lease, `python -m benchmarks.lease.ingest FOLDER` keeps its files, adds the scale
rows to the fit and prints what to refit.

`--smoke` runs every part at tiny sizes on the CPU (NF4 through bitsandbytes' CPU path):
`tests/test_gpu_lease.py` runs it, so the lease cannot rot between leases.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import table  # noqa: E402
from common.cli import check_writable, check_writable_dir, run_cli  # noqa: E402
from common.errors import BadInputError  # noqa: E402
from common.files import write_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Part:
    name: str
    module: str
    seconds: float  # its share on an H100 (the timeout is this, capped by the deadline)
    smoke_seconds: float


PARTS = (
    Part("preflight", "benchmarks.lease.preflight", 45, 60),
    Part("scale", "benchmarks.lease.scale", 170, 120),
    Part("study", "benchmarks.lease.study", 120, 150),
    Part("levers", "benchmarks.lease.levers", 125, 120),
    Part("time_model", "benchmarks.lease.time_model", 105, 120),
)
# A part stops starting new work this long before its timeout (model loads, the write-up).
WIND_DOWN_SECONDS = 25.0


def chosen(names: str) -> list[Part]:
    """The parts `--parts` names, in the lease's order."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {p.name: p for p in PARTS}
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise BadInputError(f"--parts must name some of {', '.join(known)}, but got {names!r}")
    return [p for p in PARTS if p.name in wanted]


def timeout_for(part: Part, left: float, *, smoke: bool) -> float:
    """A part's timeout: its share, never past what is left of the deadline."""
    return max(min(part.smoke_seconds if smoke else part.seconds, left), 0.0)


def run_part(
    part: Part, out: Path, work: Path, timeout: float, smoke: bool, log: Any
) -> dict[str, Any]:
    """Run one part to its end or its timeout; what it wrote is read back either way."""
    target = out / f"{part.name}.json"
    argv = [sys.executable, "-m", part.module, "--out", str(target), "--work", str(work),
            "--budget-seconds", str(max(timeout - WIND_DOWN_SECONDS, timeout / 2))]  # fmt: skip
    if smoke:
        argv.append("--smoke")
    log.write(f"\n===== {part.name}: {' '.join(argv[1:])} (timeout {timeout:.0f} s)\n")
    log.flush()
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        code: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    seconds = time.perf_counter() - started
    written: dict[str, Any] = {}
    if target.is_file():
        try:
            written = json.loads(target.read_text())
        except ValueError:
            written = {}
    status = "timed out" if code is None else written.get("status", "no output")
    if code not in (None, 0):
        status = f"exit {code}"
    return {"part": part.name, "exit_code": code, "seconds": seconds, "timeout": timeout,
            "status": status, "file": target.name if target.is_file() else None,
            "headline": headline(part.name, written)}  # fmt: skip


def headline(name: str, data: dict[str, Any]) -> str:
    """One line of what a part found, for the summary table."""
    try:
        if name == "preflight":
            c, n = data.get("ceilings", {}), data.get("nf4_linear", {})
            return (f"{data['device'].get('name')}: matmul {c.get('matmul_tflops', 0):.1f} TFLOP/s, "
                    f"copy {c.get('copy_gbps', 0):.0f} GB/s, NF4 layer ok={n.get('ok')}")  # fmt: skip
        if name == "scale":
            rows = [r for r in data.get("rows", []) if "error" not in r]
            inside = sum(bool(r["seconds_inside"]) for r in rows)
            held = sum(bool(r["reserved_below_p90"]) for r in rows)
            return (f"{len(rows)} rows ({len(data.get('rows', [])) - len(rows)} failed): "
                    f"{inside} inside p10-p90, memory p90 held {held}")  # fmt: skip
        if name == "study":
            back = data.get("read_back", {})
            ran = data.get("study", {})
            if "error" in ran:
                return str(ran["error"])
            if ran.get("exit_code") != 0:  # its last line: the error, or the traceback's end
                lines = [x for x in str(ran.get("stderr_tail", "")).splitlines() if x.strip()]
                return f"study exit {ran.get('exit_code')}: {lines[-1] if lines else ''}"[:200]
            if "error" in back:
                return f"read-back: {back['error']}"[:200]
            return (f"states {back.get('states')}, in MLflow {back.get('every_trial_in_mlflow')} "
                    f"({back.get('child_runs')} runs), GPU metrics "
                    f"{back.get('gpu_metrics_on_every_run')}, 2 workers refused "
                    f"{data.get('two_workers_one_gpu', {}).get('refused')}")  # fmt: skip
        if name == "levers":
            rows = data.get("rows", [])
            found = [f"{r['lever']} x{r['speedup']:.2f}" for r in rows if "speedup" in r]
            for r in rows:
                if isinstance(r.get("default"), dict) and "plan_lengths_vary" in r:
                    other = r.get("expandable")
                    other = (f"{other['reserved_gib']:.1f}" if isinstance(other, dict)
                             else str(other))  # fmt: skip
                    found.append(f"lengths vary: reserved {r['default']['reserved_gib']:.1f} GiB,"
                                 f" expandable {other}, plan p50 "
                                 f"{r['plan_lengths_vary']['reserved_p50_gib']:.1f}")  # fmt: skip
            return "; ".join(found)
        if name == "time_model":
            reserved = data.get("reserved_above_bound_fraction")
            over = "" if reserved is None else f", reserved > bound {100 * reserved:.0f} %"
            return (f"median |error| {data['median_abs_pct_error']:.1f} %, in band "
                    f"{100 * data['band_coverage']:.0f} %, memory > p90 "
                    f"{100 * data['memory_above_p90_fraction']:.0f} %{over}")  # fmt: skip
    except (KeyError, TypeError, ValueError):
        pass
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for every part's JSON ($OUT)")
    parser.add_argument("--parts", default=",".join(p.name for p in PARTS),
                        help="comma-separated parts to run (default: all)")  # fmt: skip
    parser.add_argument("--deadline-seconds", type=float, default=510.0,
                        help="no part runs past this, counted from the start")  # fmt: skip
    parser.add_argument("--work", help="scratch folder (models, data); default: a temporary one")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--predict", metavar="FILE",
                        help="only write the plan's predictions of every setup (no GPU)")  # fmt: skip
    args = parser.parse_args(argv)
    parts = chosen(args.parts)
    if not args.deadline_seconds > 0:  # also NaN
        raise BadInputError(f"--deadline-seconds must be > 0, but got {args.deadline_seconds}")
    if args.predict:
        check_writable(args.predict)
        from benchmarks.lease.scale import predictions

        write_json(args.predict, predictions())
        print(f"wrote {args.predict}")
        return 0
    started = time.perf_counter()
    date = datetime.datetime.now(datetime.UTC).date().isoformat()  # for benchmarks.lease.ingest
    out = Path(args.out)
    check_writable_dir(out, "--out")
    if args.work:
        check_writable_dir(args.work, "--work")
    out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpu-lease-") as tmp, \
            open(out / "lease.log", "a", encoding="utf-8") as log:  # fmt: skip
        work = Path(args.work or tmp)
        for part in parts:
            left = args.deadline_seconds - (time.perf_counter() - started)
            timeout = timeout_for(part, left, smoke=args.smoke)
            if timeout < 10:
                results.append({"part": part.name, "status": "skipped: deadline", "seconds": 0.0})
            else:
                results.append(run_part(part, out, work, timeout, args.smoke, log))
            print(f"{part.name}: {results[-1]['status']} ({results[-1]['seconds']:.0f} s)",
                  flush=True)  # fmt: skip
            write_json(out / "lease.json", {"smoke": args.smoke, "date": date, "parts": results,
                                           "seconds": time.perf_counter() - started})  # fmt: skip
    print()
    print(table(["part", "status", "s", "found"],
                [[r["part"], r["status"], round(r["seconds"]), r.get("headline", "")]
                 for r in results]))  # fmt: skip
    print(f"lease: {time.perf_counter() - started:.0f} s in all; JSON in {out}")
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
