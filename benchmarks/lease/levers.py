"""Lease part 4 (~125 s): the trainer's tokens/s with each speed lever against the same run
without it, side by side in one process, at equal loss (`trainers.model.levers`).

On Mistral-7B (random bf16 weights, the scale part's copy when it ran): Liger kernels at
2 x 2,048 tokens (the shape of the issue's 12,500 tokens/s target); the SDPA fast path at
1 x 4,096 tokens, where rows are as long as Mistral's window and transformers would mask
them explicitly; torch.compile at 2 x 2,048 when time is left. Each pair runs the same
steps on the same data from the same seed: the losses must agree (relative difference
under `EQUAL_LOSS`) for a speed-up to count. A lever joins `MEASURED_FASTER` only from
such a row.

Then the allocator with unpacked samples of many lengths (before torch.compile, which
rarely has time left): TinyLlama-1.1B at 1 x 2,048 on samples of ~10 to ~3,000 tokens,
kept apart, with PyTorch's default caching allocator and then with expandable segments
(`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, set at run time): each one's
allocated and reserved peaks and tokens/s, beside the plan's reserved p50/p90 with and
without the share for lengths that vary (`varied_length_reserve`, fitted on ms-swift's
2023 A100 table: nothing has measured it on this project's trainer).

    python -m benchmarks.lease.levers --out levers.json --work DIR [--smoke]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.gpu_scale import Setup, measure  # noqa: E402
from benchmarks.lease.part import first_line, start  # noqa: E402
from common.cli import run_cli  # noqa: E402

STEPS = 6
EQUAL_LOSS = 1e-2  # bf16 kernels that fuse differently round differently; more is a change
MODEL = "mistral-7b-v0.1"
# lever -> (the spec fields that turn it on, the shape it is measured at)
PAIRS: dict[str, tuple[dict[str, Any], Setup]] = {
    "liger": ({"liger": "on"}, Setup(2, 4, 2048, False)),
    "sdpa_fast_path": ({"sdpa_fast_path": "on"}, Setup(1, 4, 4096, False)),
    "compile": ({"compile": True}, Setup(2, 4, 2048, False)),
}
SMOKE_SHAPES = {"liger": Setup(2, 2, 64, False), "sdpa_fast_path": Setup(1, 2, 128, False),
                "compile": Setup(2, 2, 64, False)}  # fmt: skip
# Two 7B runs of 6 steps each at about 1.7-2.7 s (the plan's p50 on an H100) and a load: a
# pair is not started with less left than the last one took, nor than this.
PAIR_NEEDS_SECONDS = 30.0
COMPILE_NEEDS_SECONDS = 90.0  # a 7B model's first compiled step took ~48 s (docs/benchmarks/gpu_check.md)
ALLOCATOR_MODEL = "tinyllama-1.1b"  # loads in seconds; the allocator's share is relative
# One sample per micro-batch, as ms-swift's table: every step a new shape (at 4 per
# micro-batch most would be padded to max_length by their longest sample).
ALLOCATOR_SETUP, SMOKE_ALLOCATOR_SETUP = Setup(1, 1, 2048, False), Setup(1, 1, 128, False)
ALLOCATOR_STEPS, SMOKE_ALLOCATOR_STEPS = 24, 4
# Two runs of a 1.1B model the scale part saved: a load of seconds and 24 steps each, each
# step a new shape (0.25-2 s for a first shape on the H100, docs/benchmarks/gpu_check.md).
ALLOCATOR_NEEDS_SECONDS = 30.0


def pair(
    model: str, data: str, work: Path, lever: str, *, smoke: bool,
    measured: Callable[[dict[str, Any]], None] = lambda row: None,
) -> dict[str, Any]:  # fmt: skip
    """The run without the lever, then with it (a lever that cannot run here is a finding).

    `measured` gets the row as soon as the run without the lever ends, so that a part cut
    short keeps it.
    """
    fields, setup = PAIRS[lever]
    if smoke:
        setup = SMOKE_SHAPES[lever]
    without = measure(model, data, work, setup, STEPS, smoke=smoke, levers={
        k: ("off" if isinstance(v, str) else False) for k, v in fields.items()})  # fmt: skip
    row: dict[str, Any] = {"lever": lever, "setup": setup.label,
                           "without_tokens_per_second": without["tokens_per_second"],
                           "without_losses": [without["first_loss"], without["last_loss"]],
                           "without_reserved_gib": without["reserved_gib"]}  # fmt: skip
    measured(row)
    try:
        with_lever = measure(model, data, work, setup, STEPS, smoke=smoke, levers=fields)
    except Exception as exc:  # e.g. liger=on on the CPU, or a kernel that does not build
        return {**row, "error": first_line(exc)}
    losses = [with_lever["first_loss"], with_lever["last_loss"]]
    difference = max(
        abs(a - b) / abs(b) for a, b in zip(losses, row["without_losses"], strict=True)
    )
    speedup = with_lever["tokens_per_second"] / row["without_tokens_per_second"]
    return {**row, "with_tokens_per_second": with_lever["tokens_per_second"],
            "with_losses": losses, "with_reserved_gib": with_lever["reserved_gib"],
            "loss_rel_difference": difference, "equal_loss": difference < EQUAL_LOSS,
            "speedup": speedup, "faster_at_equal_loss": speedup > 1.0 and difference < EQUAL_LOSS,
            "runtime": with_lever["runtime"]}  # fmt: skip


def allocator_plans(
    gpu: str, setup: Setup, priors: Any, cache: dict, tokens_per_sample: float | None = None
) -> dict[str, dict[str, Any]]:
    """The plan's reserved peak of the varied-length row, with the share for lengths that vary
    and without it (whole rows). The peak follows the longest micro-batch, max_length: the
    row's data has samples longer than that. Also `scale.predictions`' (before any lease)."""
    import dataclasses

    from analysis.priors.fit import replay_with
    from benchmarks.gpu_scale import planned_row

    base = dataclasses.replace(
        planned_row(ALLOCATOR_MODEL, gpu, setup, "reserved"), packing=False,
        longest_sample=setup.max_length,
        tokens_per_sample=min(tokens_per_sample or setup.max_length, setup.max_length),
    )  # fmt: skip
    plans = {}
    for name, vary in (("lengths_vary", True), ("whole_rows", False)):
        replay = replay_with(dataclasses.replace(base, lengths_vary=vary), priors, cache)
        plans[name] = {"reserved_p50_gib": replay.memory_p50_gib,
                       "reserved_p90_gib": replay.memory_p90_gib,
                       "parts_gib": replay.memory_parts_gib}  # fmt: skip
    return plans


def allocator(work: Path, *, smoke: bool) -> dict[str, Any]:
    """Peaks of one varied-length run with the default allocator and with expandable
    segments, and the plan's reserved peak with and without the share for varying lengths."""
    import torch

    from analysis.priors.fitted import load, stored_profiles
    from benchmarks._held_out import synthetic_data
    from benchmarks.gpu_scale import gpu_name_for, measure
    from benchmarks.lease.scale import model_dir

    setup = SMOKE_ALLOCATOR_SETUP if smoke else ALLOCATOR_SETUP
    steps = SMOKE_ALLOCATOR_STEPS if smoke else ALLOCATOR_STEPS
    model = str(model_dir(work, ALLOCATOR_MODEL, smoke=smoke))  # the scale part's copy
    data = str(synthetic_data(work / "allocator-data.jsonl", samples=400, max_records=300))

    def run() -> dict[str, Any]:
        got = measure(model, data, work / "levers" / "allocator", setup, steps, smoke=smoke,
                      overflow="truncate")  # fmt: skip
        return {key: got[key] for key in ("allocated_gib", "reserved_gib", "tokens_per_second",
                                          "tokens_per_step", "first_loss", "last_loss")}  # fmt: skip

    row: dict[str, Any] = {"lever": "expandable_segments", "model": ALLOCATOR_MODEL,
                           "setup": f"{setup.label}, unpacked, lengths vary", "steps": steps,
                           "default": run()}  # fmt: skip
    try:  # the plan beside it; a failure there must not lose the run just measured
        priors = load()
        if priors is not None:
            gpu = "H100" if smoke else gpu_name_for(torch.cuda.get_device_name(0))
            per_sample = row["default"]["tokens_per_step"] / setup.micro_batch_size
            plans = allocator_plans(gpu, setup, priors, stored_profiles(), per_sample)
            row["plan_lengths_vary"] = plans["lengths_vary"]
            row["plan_whole_rows"] = plans["whole_rows"]
    except Exception as exc:
        row["plan_error"] = first_line(exc)
    if smoke:
        row["expandable"] = "not on the CPU (a CUDA allocator setting)"
        return row
    try:  # expandable segments map memory through CUDA's virtual memory API: a sandbox
        # (the H200 machines run under gVisor) may lack it; the default run is kept then
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
        row["expandable"] = run()
    except Exception as exc:
        row["expandable"] = f"failed: {first_line(exc)}"
        return row
    finally:
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")
    row["speedup"] = row["expandable"]["tokens_per_second"] / row["default"]["tokens_per_second"]
    return row


def main(argv: list[str] | None = None) -> int:
    args, record, work = start("levers", __doc__, argv)
    from benchmarks._held_out import synthetic_data
    from benchmarks.lease.scale import model_dir
    model = str(model_dir(work, MODEL, smoke=args.smoke))
    data = str(synthetic_data(work / "levers-data.jsonl", samples=300 if args.smoke else 3000))
    took: float | None = None  # the last pair's seconds: the next one at its shape takes about that
    for lever in PAIRS:
        if lever == "compile":
            if record.left() < ALLOCATOR_NEEDS_SECONDS:
                record.skip("expandable_segments: not enough time left")
            else:
                try:
                    record.append("rows", allocator(work, smoke=args.smoke))
                except Exception as exc:
                    record.append("rows", {"lever": "expandable_segments", "error": first_line(exc)})
        if lever == "compile" and (args.smoke or record.left() < COMPILE_NEEDS_SECONDS):
            record.skip("compile: " + ("minutes of compilation on a CPU" if args.smoke
                                       else "not enough time left"))  # fmt: skip
            continue
        need = max(took or 0.0, 0.0 if args.smoke else PAIR_NEEDS_SECONDS)
        if record.left() < need:
            record.skip(f"{lever}: {record.left():.0f} s left, it needs ~{need:.0f} s")
            continue
        started = record.elapsed()

        def keep(row: dict[str, Any], at: int = len(record.data.get("rows", []))) -> None:
            # The run without the lever, then the whole pair, in one place.
            record.data.setdefault("rows", [])[at:] = [row]
            record.save()

        try:
            keep(pair(model, data, work / "levers", lever, smoke=args.smoke, measured=keep))
        except Exception as exc:
            keep({"lever": lever, "error": first_line(exc)})
        took = record.elapsed() - started
    record.finish()
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
