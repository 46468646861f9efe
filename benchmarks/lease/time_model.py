"""Lease part 5 (what time is left): the time model calibrated by the probe design on this GPU,
then held-out runs it never saw, as `benchmarks/gpu_check.py` runs them after the refit that
added a step at a new length (`new_shape_seconds`).

Writes what the probes and held-out runs measured too (`raw`), so that
`python -m benchmarks.time_model_refit` can refit offline what a lease measured.

    python -m benchmarks.lease.time_model --out time_model.json --work DIR [--smoke]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lease.part import Record, cuda_or_smoke, parser  # noqa: E402
from common.cli import run_cli  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    record = Record(args.out, "time_model", args.budget_seconds)
    cuda_or_smoke(args.smoke)
    from benchmarks._held_out import synthetic_data
    from benchmarks.gpu_check import GPU_DIMS, SMOKE_DIMS, build_model, time_model

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = work / "models" / "study-llama"  # the study part's model, when it ran
    if not (model / "config.json").is_file():
        build_model(model, SMOKE_DIMS if args.smoke else GPU_DIMS)
    data = str(synthetic_data(work / "time-model-data.jsonl"))
    raw = str(Path(args.out).with_name("time_model_raw.json"))
    result = time_model(str(model), data, work / "time-model", smoke=args.smoke, raw=raw)
    for key, value in result.items():
        record.set(key, value)
    record.set("raw", Path(raw).name)
    record.finish()
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
