"""Lease part 2 (~150 s): the plan against the trainer at 7B scale, 16-bit and NF4 (QLoRA).

`benchmarks/gpu_scale.py`'s measurement and replay (each setup as a published row through
the plan's own code), on Mistral-7B at two shapes, with and without gradient checkpointing,
each with a bf16 base and an NF4 base, and TinyLlama-1.1B: seconds per optimizer step
against the plan's p10/p50/p90 and peak memory (allocated and reserved) against its
p50/p90. The bases are kept between setups of one model and quantization
(`RunInputs(keep_base=True)`): a 7B base loads in tens of seconds. The models are built once
under the lease's work folder, where the levers part finds Mistral-7B again.

    python -m benchmarks.lease.scale --out scale.json --work DIR [--smoke]
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.gpu_scale import Setup, build_model, compare, gpu_name_for, measure  # noqa: E402
from benchmarks.lease.part import Record, cuda_or_smoke, first_line, parser  # noqa: E402
from common.cli import run_cli  # noqa: E402
from common.errors import BadInputError  # noqa: E402

STEPS = 6
# model -> setups, in the order they run: the 16-bit ones on one loaded base, then NF4.
SETUPS: dict[str, tuple[Setup, ...]] = {
    "mistral-7b-v0.1": (
        Setup(2, 4, 2048, False),
        Setup(1, 4, 4096, True),
        Setup(2, 4, 2048, False, quantization="nf4"),
        Setup(1, 4, 4096, True, quantization="nf4"),
    ),
    "tinyllama-1.1b": (
        Setup(4, 4, 2048, False),
        Setup(4, 4, 2048, False, quantization="nf4"),
    ),
}
# The smoke: Mistral's setups at 1/32 of the length and accumulation 2; TinyLlama's NF4 one
# at micro-batch 2 (on the CPU in seconds).
SMOKE_SETUPS: dict[str, tuple[Setup, ...]] = {
    "mistral-7b-v0.1": tuple(
        replace(s, gradient_accumulation_steps=2, max_length=s.max_length // 32)
        for s in SETUPS["mistral-7b-v0.1"]
    ),
    "tinyllama-1.1b": (Setup(2, 2, 64, False, quantization="nf4"),),
}


# What a setup costs beyond its steps, to start only setups that end inside the part: a new
# base (built and saved once, then loaded in 16 bits or quantized to NF4) about 3 s + 2.5 s
# per billion parameters, and the Trainer's set-up about 5 s. The H100 lease of 2026-11-24
# spent about 7 s per setup beyond its steps, loading a 7-8B base for each
# (docs/measurements/gpu-scale-h100.json: 307 s, 222 s of them steps, 12 setups).
BILLIONS = {"mistral-7b-v0.1": 7.24, "tinyllama-1.1b": 1.10}
SETUP_SECONDS = 5.0


def base_seconds(name: str, *, smoke: bool) -> float:
    return 3.0 + (0.0 if smoke else 2.5 * BILLIONS[name])  # the smoke's models are shrunk


def expected_seconds(
    name: str, gpu: str, setup: Setup, priors: Any, cache: dict, *,
    new_base: bool, build: bool, smoke: bool = False,
) -> float:  # fmt: skip
    """The setup's STEPS at the plan's p90 step, its set-up, and its base where it loads one."""
    from analysis.priors.fit import replay_with
    from benchmarks.gpu_scale import planned_row

    step = replay_with(planned_row(name, gpu, setup, "allocated"), priors, cache).seconds_p90
    bases = int(new_base) + int(build)
    return STEPS * step + SETUP_SECONDS + base_seconds(name, smoke=smoke) * bases


def model_dir(work: Path, name: str, *, smoke: bool) -> Path:
    """The lease's copy of a shipped config with random weights (built once, then reused)."""
    out = work / "models" / name
    if not (out / "config.json").is_file():
        build_model(name, out, smoke=smoke)
    return out


def setups_of(smoke: bool) -> dict[str, tuple[Setup, ...]]:
    return SMOKE_SETUPS if smoke else SETUPS


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    record = Record(args.out, "scale", args.budget_seconds)
    cuda_or_smoke(args.smoke)

    import torch

    from analysis.priors.fitted import load
    from benchmarks._held_out import synthetic_data
    from trainers.loop.inputs import RunInputs

    gpu = "H100" if args.smoke else gpu_name_for(torch.cuda.get_device_name(0))
    record.set("gpu", gpu)
    priors = load()
    if priors is None:
        raise BadInputError("no published priors stored (analysis/priors/published_priors.json)")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = str(synthetic_data(work / "scale-data.jsonl", samples=300 if args.smoke else 6000))
    cache: dict = {}
    for name, setups in setups_of(args.smoke).items():
        inputs = RunInputs(keep_base=True)
        folder: Path | None = None
        loaded: str | None = None  # the quantization of the base `inputs` holds
        for setup in setups:
            # Start only what ends inside the part: a later, cheaper setup may still fit.
            need = expected_seconds(name, gpu, setup, priors, cache, smoke=args.smoke,
                                    new_base=setup.quantization != loaded, build=folder is None)  # fmt: skip
            if record.left() < need:
                record.skip(f"{name} {setup.label} (needs ~{need:.0f} s)")
                continue
            if folder is None:  # built and saved once (14.5 GB for Mistral-7B): its time is kept
                built = record.elapsed()
                folder = model_dir(work, name, smoke=args.smoke)
                record.append("builds", {"model": name, "seconds": record.elapsed() - built})
            loaded = setup.quantization
            began = record.elapsed()
            try:
                measured = measure(str(folder), data, work / "scale", setup, STEPS,
                                   smoke=args.smoke, inputs=inputs)  # fmt: skip
            except Exception as exc:  # out of memory or a kernel missing: a finding
                record.append("rows", {"model": name, "setup": setup.label,
                                       "quantization": setup.quantization,
                                       "error": first_line(exc)})  # fmt: skip
                inputs.release()  # the base stays loaded for the next setup
                continue  # the next `measure` collects what the failure left
            # The setup's fields too: `benchmarks.lease.ingest` makes fitted rows of them.
            row = {"model": name, **dataclasses.asdict(setup), **measured,
                   **compare(name, gpu, setup, measured, priors, cache),
                   # Against `need`: what the next lease's gate learns from.
                   "wall_seconds": record.elapsed() - began, "expected_seconds": need}  # fmt: skip
            record.append("rows", row)
            print(json.dumps({k: row[k] for k in ("model", "setup", "tokens_per_second")}),
                  flush=True)  # fmt: skip
        del inputs  # a 4-bit base lives on in a cycle until the next `measure` collects it
    record.finish()
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))


def predictions(gpus: tuple[str, ...] = ("H100", "H200")) -> dict[str, Any]:
    """The plan's replay of every lease setup on each GPU, before anything is measured.

    The same replay `compare` makes of a measured row (`analysis.priors.fit`), with
    nothing measured: seconds per optimizer step p10/p50/p90, tokens/s at the p50 and peak
    memory p50/p90 (allocated and reserved). The levers part's pairs run without the lever at
    these shapes too; a lever's own effect has no prior (a factor of 1 until measured).
    """
    from analysis.priors.fit import replay_with
    from analysis.priors.fitted import load
    from benchmarks.gpu_scale import planned_row
    from benchmarks.lease.levers import MODEL, PAIRS

    priors = load()
    if priors is None:
        raise BadInputError("no published priors stored (analysis/priors/published_priors.json)")
    setups = [(name, s) for name, group in SETUPS.items() for s in group]
    setups += [(MODEL, s) for _, s in PAIRS.values() if (MODEL, s) not in setups]
    cache: dict = {}
    rows = []
    for gpu in gpus:
        for name, setup in setups:
            row: dict[str, Any] = {"gpu": gpu, "model": name, "setup": setup.label,
                                   **dataclasses.asdict(setup)}  # fmt: skip
            for kind in ("allocated", "reserved"):
                plan = replay_with(planned_row(name, gpu, setup, kind), priors, cache)
                row[f"{kind}_p50_gib"] = plan.memory_p50_gib
                row[f"{kind}_p90_gib"] = plan.memory_p90_gib
            tokens = setup.micro_batch_size * setup.gradient_accumulation_steps * setup.max_length
            row.update(seconds_p10=plan.seconds_p10, seconds_p50=plan.seconds_p50,
                       seconds_p90=plan.seconds_p90, tokens_per_second_p50=tokens / plan.seconds_p50)  # fmt: skip
            rows.append(row)
    return {"what": "analysis.plan's replay of every lease setup, before the lease measured it",
            "priors": "analysis/priors/published_priors.json", "rows": rows,
            "allocator": allocator_predictions(gpus, priors, cache)}  # fmt: skip


def allocator_predictions(gpus: tuple[str, ...], priors: Any, cache: dict) -> list[dict[str, Any]]:
    """The levers part's varied-length run (`levers.allocator_plans`) on each GPU."""
    from benchmarks.lease.levers import ALLOCATOR_MODEL, ALLOCATOR_SETUP, allocator_plans

    return [
        {"gpu": gpu, "model": ALLOCATOR_MODEL, "setup": ALLOCATOR_SETUP.label,
         **allocator_plans(gpu, ALLOCATOR_SETUP, priors, cache)}
        for gpu in gpus
    ]  # fmt: skip
