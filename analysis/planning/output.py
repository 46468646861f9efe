"""What `python -m analysis.plan` prints and writes: the plan as one JSON-ready dict, and as text."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from analysis.planning.fits import Fit, Target, plan_of_shape
from analysis.timemodel.run_setup import MemoryTerms, RunSetup, memory_parts
from common.fmt import format_duration

GIB = 2**30


def _fit_dict(fit: Fit, price: float | None) -> dict[str, Any]:
    e = fit.estimate
    return {
        "run": dict(fit.shape.__dict__),
        "duration_hours": {"p10": e.seconds_p10 / 3600, "p50": e.seconds_p50 / 3600, "p90": e.seconds_p90 / 3600},
        "peak_memory_gib": e.peak_memory_bytes / GIB,
        "peak_memory_gib_p90": e.peak_memory_bytes_p90 / GIB,
        "tokens_per_second": e.tokens_per_second,
        "optimizer_steps": e.optimizer_steps,
        "train_tokens": e.train_tokens,
        "cost": e.cost(price) if price is not None else None,
        "fits_memory": fit.fits_memory,
        "fits_window": fit.fits_window,
        "fits": fit.fits,
    }  # fmt: skip


def plan_report(
    args: argparse.Namespace,
    target: Target,
    config: Any,
    source: str,
    measured: str,
    runs: tuple[Fit, Fit],
    profiles: dict[str, Fit],
) -> dict[str, Any]:
    """The plan as one JSON-ready dict (what --json writes and the text shows).

    Args:
        args: The command's flags.
        target: What the runs were planned for (with a setup and its memory terms).
        config: The model's configuration.
        source: Where the coefficients come from.
        measured: How the data's lengths were measured.
        runs: The run asked for, and the same run with checkpointing switched.
        profiles: Each profile's best run.
    """
    chosen, other = runs
    model, lengths, gpu = target.model, target.lengths, target.gpu
    setup, terms = target.setup or RunSetup(), target.memory or MemoryTerms()
    setup_terms = (setup, terms)
    memory = {
        key: value / GIB
        for key, value in memory_parts(target.plan(chosen.shape), setup, terms).items()
    }
    with_gc, without_gc = (other, chosen) if other.shape.gradient_checkpointing else (chosen, other)
    return {
        "model": {"config": str(args.model_config), "model_type": config.model_type, **model.__dict__},
        "gpu": {"name": gpu.name, "device_name": gpu.device_name, "memory_gib": gpu.memory_gib, "precision": gpu.precision},
        "coefficients": source,
        "prior_based": source.startswith("priors"),
        "data": {"train_samples": len(lengths), "tokens": sum(lengths), "lengths": measured},
        "window_hours": args.window_hours,
        "price_per_hour": args.price_per_hour,
        "setup": setup.to_dict(),
        "memory_terms": terms.to_dict(),
        "plan": _fit_dict(chosen, args.price_per_hour),
        "memory_gib": memory,
        "activations_gib": {
            "without_gradient_checkpointing": _activations(without_gc, target, setup_terms),
            "with_gradient_checkpointing": _activations(with_gc, target, setup_terms),
        },
        "other_checkpointing": _fit_dict(other, args.price_per_hour),
        "grouped_by_length": _grouped(chosen, target, args.price_per_hour),
        "profiles": {name: _fit_dict(fit, args.price_per_hour) for name, fit in profiles.items()},
    }  # fmt: skip


def remedy_report(fit: Fit, chosen: Fit, price: float | None, *, nf4: bool = False) -> dict[str, Any]:
    """A run that fits where `chosen` does not (`analysis.planning.fits.memory_remedy`, or
    `nf4_instead` with `nf4`), with the flags that make `chosen`'s command plan it."""
    return {**_fit_dict(fit, price), "flags": remedy_flags(fit, chosen, nf4=nf4)}


def remedy_flags(fit: Fit, chosen: Fit, *, nf4: bool = False) -> str:
    """The plan's flags that turn `chosen`'s run into `fit`'s."""
    flags = ["--quantization nf4"] if nf4 else []
    shape, before = fit.shape, chosen.shape
    if shape.micro_batch_size != before.micro_batch_size:
        flags.append(f"--micro-batch-size {shape.micro_batch_size}")
    if shape.gradient_accumulation_steps != before.gradient_accumulation_steps:
        flags.append(f"--gradient-accumulation-steps {shape.gradient_accumulation_steps}")
    if shape.gradient_checkpointing != before.gradient_checkpointing:
        flags.append(("--" if shape.gradient_checkpointing else "--no-") + "gradient-checkpointing")
    return " ".join(flags)


def _remedy_line(remedy: dict[str, Any], window: float | None) -> str:
    hours = remedy["duration_hours"]
    run = remedy["run"]
    batch = run["micro_batch_size"] * run["gradient_accumulation_steps"]
    return (
        f"fits the memory with {remedy['flags']} (the same effective batch of {batch}): "
        f"peak {remedy['peak_memory_gib']:.1f} GiB (p90 {remedy['peak_memory_gib_p90']:.1f}), "
        f"p50 {format_duration(hours['p50'] * 3600)}, p90 {format_duration(hours['p90'] * 3600)}: "
        f"fits {_verdict(remedy, window)}"
    )


def _nf4_line(nf4: dict[str, Any], window: float | None) -> str:
    hours = nf4["duration_hours"]
    return (
        f"with an NF4 base ({nf4['flags']}): peak {nf4['peak_memory_gib']:.1f} GiB "
        f"(p90 {nf4['peak_memory_gib_p90']:.1f}), p50 {format_duration(hours['p50'] * 3600)}, "
        f"p90 {format_duration(hours['p90'] * 3600)}: fits {_verdict(nf4, window)}"
    )


def _grouped(chosen: Fit, target: Target, price: float | None) -> dict[str, Any] | None:
    """The chosen run with its micro-batches grouped by length, where that can pad less."""
    setup = target.setup
    if setup is None or setup.packing or setup.group_by_length:
        return None
    if chosen.shape.micro_batch_size <= 1 or len(set(target.lengths)) <= 1:
        return None  # nothing to pad
    grouped = dataclasses.replace(target, setup=dataclasses.replace(setup, group_by_length=True))
    return _fit_dict(grouped.evaluate(chosen.shape), price)


def _activations(fit: Fit, target: Target, setup_terms: tuple[RunSetup, MemoryTerms]) -> float:
    """Activations and logits of `fit`'s run (its plan unpacked), in GiB."""
    parts = memory_parts(
        plan_of_shape(fit.shape, target.model, target.lengths, target.gpu), *setup_terms
    )
    return (parts["activations"] + parts["logits"]) / GIB


def plan_lines(report: dict[str, Any]) -> list[str]:
    """The plan as text, for people."""
    model, gpu, plan = report["model"], report["gpu"], report["plan"]
    run, hours = plan["run"], plan["duration_hours"]
    active = model["active_parameters"]
    lines = [
        f"model: {model['config']} ({model['model_type']}, {model['total_parameters'] / 1e9:.2f}B parameters"
        + (f" ({active / 1e9:.2f}B active per token)" if active else "") + ", "
        f"LoRA rank {run['lora_r']}: {run['lora_r'] * model['lora_parameters_per_rank'] / 1e6:.1f}M trainable)",
        f"gpu: {gpu['name']} ({gpu['device_name']}, {gpu['memory_gib']:.1f} GiB, {gpu['precision']})",
        f"time model: {report['coefficients']}",
        f"data: {report['data']['train_samples']} training samples, {report['data']['tokens']:,} tokens ({report['data']['lengths']})",
        f"run: micro-batch {run['micro_batch_size']} x accumulation {run['gradient_accumulation_steps']}, "
        f"max_length {run['max_length']}, gradient checkpointing {'on' if run['gradient_checkpointing'] else 'off'}, "
        f"{run['epochs']:g} epoch(s), {plan['optimizer_steps']} optimizer steps"
        + (" on 1 GPU (the GPUs table below: on several)" if report.get("gpu_counts") else ""),
        "setup: attention {attention}, LoRA targets {targets}, logits {logits}, {packing}longest "
        "sample {longest}, memory as {measure}".format(
            attention=report["setup"]["attention"],
            targets=report["setup"]["lora_targets"] if isinstance(report["setup"]["lora_targets"], str)
            else ",".join(report["setup"]["lora_targets"]),
            logits="fp32" if report["setup"]["logits_fp32"] else "16-bit/chunked",
            packing=("packed, " if report["setup"]["packing"] else "")
            + ("lengths vary, " if report["setup"]["lengths_vary"] and not report["setup"]["packing"] else "")
            + ("NF4 base (QLoRA), " if report["setup"]["quantization"] == "nf4" else ""),
            longest=report["setup"]["longest_sample"] or run["max_length"],
            measure=report["setup"]["memory_measure"],
        ),
        f"duration: p10 {format_duration(hours['p10'] * 3600)}, p50 {format_duration(hours['p50'] * 3600)}, "
        f"p90 {format_duration(hours['p90'] * 3600)} ({plan['tokens_per_second']:,.0f} tokens/s)",
        "peak memory: {:.1f} GiB (p90 {:.1f}) = ".format(plan["peak_memory_gib"], plan["peak_memory_gib_p90"])
        + ", ".join(f"{key} {value:.2f}" for key, value in report["memory_gib"].items()),
        "activations and logits: {:.2f} GiB without gradient checkpointing, {:.2f} GiB with".format(
            *report["activations_gib"].values()
        ),
    ]  # fmt: skip
    other = report["other_checkpointing"]
    lines.append(
        f"with gradient checkpointing {'on' if other['run']['gradient_checkpointing'] else 'off'}: "
        f"peak {other['peak_memory_gib']:.1f} GiB, p50 {format_duration(other['duration_hours']['p50'] * 3600)}"
    )
    varied = report["memory_gib"].get("varied_length_reserve", 0.0)
    if varied > 0:
        lines.append(
            f"samples of different lengths: {varied:.1f} GiB of the peak is the allocator holding blocks "
            "of earlier micro-batch shapes; packing (--packing padding_free) removes it, and so may "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch's remedy, unmeasured here)"
        )
    grouped = report.get("grouped_by_length")
    if grouped is not None and plan["train_tokens"] > 0:
        less = 1.0 - grouped["train_tokens"] / plan["train_tokens"]
        lines.append(
            f"grouped by length (--packing group_by_length): p50 {format_duration(grouped['duration_hours']['p50'] * 3600)}, "
            f"p90 {format_duration(grouped['duration_hours']['p90'] * 3600)}, {less:.0%} fewer padded tokens"
        )
    if plan["cost"] is not None:
        cost = plan["cost"]
        lines.append(
            f"cost: p10 {cost['p10']:.2f}, p50 {cost['p50']:.2f}, p90 {cost['p90']:.2f} at {report['price_per_hour']:g}/h"
        )
    lines.append(f"fits: {_verdict(plan, report['window_hours'])}")
    if report.get("memory_remedy"):
        lines.append(_remedy_line(report["memory_remedy"], report["window_hours"]))
    if report.get("nf4_base"):
        lines.append(_nf4_line(report["nf4_base"], report["window_hours"]))
    search = report.get("search")
    if search:
        lines.extend(search["lines"])
        both = (
            f"search + run: p50 {format_duration(search['search_and_run_hours_p50'] * 3600)}, "
            f"p90 {format_duration(search['search_and_run_hours_p90'] * 3600)}"
        )
        window = report["window_hours"]
        if window is not None:
            inside = search["search_and_run_hours_p90"] <= window
            both += f" ({'inside' if inside else 'NOT inside'} {window:g} h)"
        lines.append(both)
    lines.append("profiles (fastest fitting micro-batch x accumulation of each):")
    for name, fit in report["profiles"].items():
        r, h = fit["run"], fit["duration_hours"]
        lines.append(
            f"  {name:<18} {r['micro_batch_size']:>3} x {r['gradient_accumulation_steps']:<3} len {r['max_length']:<5} "
            f"p50 {format_duration(h['p50'] * 3600):>9}  p90 {format_duration(h['p90'] * 3600):>9}  "
            f"memory p90 {fit['peak_memory_gib_p90']:6.1f} GiB  {_verdict(fit, report['window_hours'])}"
        )  # fmt: skip
    if report.get("gpu_counts"):
        lines.extend(gpu_count_lines(report["gpu_counts"], report["window_hours"]))
    if report["prior_based"]:
        lines.append(
            "prior-based: measure on this GPU (python -m analysis.calibrate) to narrow the band"
        )
    return lines


def gpu_count_report(
    fits: list[Fit], fastest: Fit | None, cheapest: Fit | None, price: float | None
) -> dict[str, Any]:
    """The run on each GPU count (`analysis.planning.fits.gpu_counts`), JSON-ready."""
    return {
        "runs": [
            {"gpus": f.shape.gpus, **_fit_dict(f, price),
             "allreduce_seconds_per_step": f.estimate.extra["allreduce_seconds_each"],
             "gpu_hours_p90": f.shape.gpus * f.estimate.seconds_p90 / 3600}
            for f in fits
        ],
        "fastest": fastest.shape.gpus if fastest else None,
        "cheapest": cheapest.shape.gpus if cheapest else None,
    }  # fmt: skip


def gpu_count_lines(counts: dict[str, Any], window: float | None) -> list[str]:
    """The GPU-count table, then the fastest and the cheapest count that fit."""
    lines = ["GPUs (data-parallel; micro-batch x accumulation per GPU, cost = GPUs x price x hours):"]
    for run in counts["runs"]:
        r, h, cost = run["run"], run["duration_hours"], run["cost"]
        money = f"  cost p50 {cost['p50']:,.2f} p90 {cost['p90']:,.2f}" if cost else ""
        lines.append(
            f"  {run['gpus']:>2} x {r['micro_batch_size']:>3} x {r['gradient_accumulation_steps']:<3} "
            f"p50 {format_duration(h['p50'] * 3600):>9}  p90 {format_duration(h['p90'] * 3600):>9}  "
            f"GPU-hours p90 {run['gpu_hours_p90']:7.1f}{money}  memory p90 "
            f"{run['peak_memory_gib_p90']:5.1f} GiB/GPU  {_verdict(run, window)}"
        )  # fmt: skip
    lines.append(_count_verdict(counts, window))
    remedy = counts.get("memory_remedy")
    if remedy is not None:
        lines.append(f"with {remedy['flags']}: " + _count_verdict(remedy, window))
    nf4 = counts.get("nf4_base")
    if nf4 is not None:
        lines.append(f"with an NF4 base ({nf4['flags']}): " + _count_verdict(nf4, window))
    return lines


def _count_verdict(counts: dict[str, Any], window: float | None) -> str:
    if counts["fastest"] is not None:
        return f"fastest that fits: {counts['fastest']} GPU(s); cheapest that fits: {counts['cheapest']} GPU(s)"
    # Data parallelism copies the model to every GPU: more GPUs do not make it fit.
    if window is None or not any(run["fits_memory"] for run in counts["runs"]):
        return "no GPU count fits the memory"
    return f"no GPU count fits the {window:g} h window"


def _verdict(fit: dict[str, Any], window: float | None) -> str:
    if not fit["fits_memory"]:
        return "no (out of memory)"
    if fit["fits_window"] is False:
        return f"no (p90 over the {window:g} h window)"
    return "yes" if window is not None else "yes (memory; no window given)"
