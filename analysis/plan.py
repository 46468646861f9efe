"""`python -m analysis.plan`: will this LoRA run fit, how long, at what cost, before any download.

From a model's `config.json` alone (built on the meta device, no weights), a GPU and the data's
size, it predicts the full run's duration (p10/p50/p90), its peak memory by part (weights,
LoRA parameters, optimizer state, activations; with and without gradient checkpointing), its
cost, and which batch profiles fit the window and the GPU. The prediction is the study's own
time model, with the GPU's priors or a calibration measured on that GPU (it says which).

Examples::

    python -m analysis.plan --model-config config.json --gpu A100-80GB --samples 50000 \\
        --max-length 1024 --profile balanced --window-hours 12 --price-per-hour 1.8
    python -m analysis.plan --model-config mistral-7b-v0.1 --gpu RTX4090 --data train.jsonl \\
        --tokenizer tokenizer-dir --micro-batch-size 2 --gradient-accumulation-steps 8
    python -m analysis.plan --model-config mistral-7b-v0.1 --gpu H100 --samples 600000 \\
        --epochs 3 --window-hours 12 --price-per-hour 2.5 --gpus 1,2,4,8
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.planning.fits import (
    Fit,
    RunShape,
    Target,
    best_of_profile,
    coefficients_for,
    gpu_counts,
    memory_remedy,
    nf4_instead,
    toggled_checkpointing,
)
from analysis.planning.inputs import (
    lengths_from_count,
    lengths_from_data,
    load_model_config,
    shipped_configs,
)
from analysis.planning.output import (
    gpu_count_report,
    plan_lines,
    plan_report,
    remedy_flags,
    remedy_report,
)
from analysis.search.schedule import DEFAULT_RUNGS, DEFAULT_TRIAL_FRACTION, parse_rungs
from analysis.timemodel.gpus import KNOWN_GPUS, GpuSpec, custom_gpu, find_gpu
from analysis.timemodel.interconnect import DEFAULT_LINK, LINKS
from analysis.timemodel.run_setup import (
    ATTENTION_KERNELS,
    MEMORY_MEASURES,
    MemoryTerms,
    RunSetup,
)
from common.cli import EXIT_OK, check_writable, run_cli
from common.errors import BadInputError
from common.files import write_json
from trainers.spec import PACKING_MODES, QUANTIZATION_MODES

GIB = 2**30
DEFAULT_SHAPE = RunShape(
    micro_batch_size=4, gradient_accumulation_steps=4, max_length=512, lora_r=16
)


def build_parser() -> argparse.ArgumentParser:
    """The command's flags."""
    parser = argparse.ArgumentParser(
        prog="python -m analysis.plan",
        description="Predict a LoRA run's duration, memory and cost from a config.json alone.",
        epilog="Shipped configs (pass the name): " + ", ".join(shipped_configs()),
    )
    parser.add_argument(
        "--model-config", required=True, help="config.json, its folder, or a shipped name."
    )
    for add in (_gpu_flags, _data_flags, _run_flags, _setup_flags, _search_flags):
        add(parser)
    parser.add_argument("--json", help="Write the plan to this JSON file.")
    return parser


def _gpu_flags(parser: argparse.ArgumentParser) -> None:
    """The GPU: a known one by name, or its peak and memory; calibrations of it."""
    gpu = parser.add_argument_group("GPU")
    gpu.add_argument(
        "--gpu",
        required=True,
        help=f"One of {', '.join(g.name for g in KNOWN_GPUS)}, or any name with --gpu-tflops and --gpu-memory-gb.",
    )
    gpu.add_argument(
        "--gpu-tflops", type=float, help="Dense bf16 peak TFLOP/s of a GPU not in the list."
    )
    gpu.add_argument("--gpu-memory-gb", type=float, help="Memory (GB) of a GPU not in the list.")
    gpu.add_argument(
        "--calibration",
        action="append",
        default=[],
        help="Calibration file(s); one measured on this GPU replaces the priors.",
    )


def _data_flags(parser: argparse.ArgumentParser) -> None:
    """The data: its size (and tokens per sample), or a file to measure."""
    data = parser.add_argument_group("data (one of --samples or --data)")
    data.add_argument("--samples", type=int, help="Samples in the data set.")
    data.add_argument(
        "--tokens-per-sample",
        type=int,
        help="Tokens per sample with --samples (default: --max-length, every sample full).",
    )
    data.add_argument(
        "--data",
        help="Data whose token lengths are measured (JSONL, Parquet, CSV, JSON, a folder of "
        "them or a Dataset.save_to_disk folder).",
    )
    data.add_argument("--tokenizer", help="Tokenizer folder for --data (default: characters / 4).")
    data.add_argument(
        "--data-columns",
        help="--data's columns read as hpo's fields, FIELD=COLUMN joined by commas "
        "(input=context,output=response), as the study reads them.",
    )
    data.add_argument(
        "--validation-split",
        help="--data's split that validates (a data folder's or saved DatasetDict's), as the "
        "study's validation_split: the whole train split trains (default: a share of it is "
        "held out).",
    )


def _run_flags(parser: argparse.ArgumentParser) -> None:
    """The run: a profile of the search space, or explicit values."""
    run = parser.add_argument_group("run (a --profile, or explicit values; explicit values win)")
    run.add_argument("--profile", help="A batch profile of the search space (fast, balanced, ...).")
    run.add_argument(
        "--space", help="Search space whose profiles are used (default: the model family's)."
    )
    run.add_argument(
        "--micro-batch-size",
        type=int,
        help="Samples per forward/backward on one GPU (default: the profile's, else "
        f"{DEFAULT_SHAPE.micro_batch_size}).",
    )
    run.add_argument(
        "--gradient-accumulation-steps",
        type=int,
        help="Micro-batches per optimizer step (default: the profile's, else "
        f"{DEFAULT_SHAPE.gradient_accumulation_steps}).",
    )
    run.add_argument(
        "--max-length",
        type=int,
        help="Tokens per training sample (default: the profile's own, else with --data the "
        f"data's p99 token length, as a study trains, else {DEFAULT_SHAPE.max_length}).",
    )
    run.add_argument(
        "--lora-r", type=int, default=DEFAULT_SHAPE.lora_r, help="LoRA rank (every linear layer)."
    )
    run.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Recompute activations: less memory, slower steps (default: the profile's, else off).",
    )
    run.add_argument("--epochs", type=float, default=1.0, help="Passes over the training set.")
    run.add_argument(
        "--gpus",
        default="1",
        help="GPUs of one data-parallel run, or several counts to compare (e.g. 1,2,4,8): the "
        "run's micro-batch x accumulation is for one GPU, its accumulation (else micro-batch) "
        "divided among them; the cost is GPUs x price x hours (default 1).",
    )


def _setup_flags(parser: argparse.ArgumentParser) -> None:
    """What moves time and memory beside the batch: kernels, targets, packing."""
    setup = parser.add_argument_group("setup (what moves time and memory; --json shows each value)")
    setup.add_argument(
        "--attention",
        choices=ATTENTION_KERNELS,
        default="sdpa",
        help="Attention kernel: eager stores the score matrices (memory quadratic in length).",
    )
    setup.add_argument(
        "--lora-targets",
        default="all-linear",
        help="all-linear, or module names separated by commas (e.g. q_proj,v_proj).",
    )
    setup.add_argument(
        "--fp32-logits",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="The loss upcasts the full logits to fp32 (transformers does; chunked losses do not).",
    )
    setup.add_argument(
        "--memory-measure",
        choices=MEMORY_MEASURES,
        default="reserved",
        help="Peak as reserved (nvidia-smi, most tables) or as allocated by tensors.",
    )
    setup.add_argument(
        "--longest-sample",
        type=int,
        help="Tokens of the longest sample (peak memory follows it; default: the longest "
        "measured with --data, else --max-length).",
    )
    setup.add_argument(
        "--packing",
        nargs="?",
        const="padding_free",
        default="none",
        choices=PACKING_MODES,
        help="padding_free: samples packed into sequences of --max-length tokens (fewer, fuller "
        "micro-batches: steps from the data's lengths); group_by_length: samples kept apart, "
        "each micro-batch of about one length (less padding, less waiting on several GPUs); "
        "--packing alone means padding_free.",
    )
    setup.add_argument(
        "--quantization",
        choices=QUANTIZATION_MODES,
        default="none",
        help="nf4: QLoRA, the base's linear layers in 4 bits (~0.52 byte per weight; slower "
        "steps: a prior x1.39, band x1.15-x1.8, until trials measure it).",
    )
    setup.add_argument(
        "--interconnect",
        choices=tuple(LINKS),
        default=DEFAULT_LINK,
        help="The link between the GPUs of a run on several (its all-reduce; default "
        f"{DEFAULT_LINK}): " + "; ".join(f"{k}: {v.about}" for k, v in LINKS.items()) + ".",
    )


def _search_flags(parser: argparse.ArgumentParser) -> None:
    """The window and price of the run, and the study before it."""
    budget = parser.add_argument_group("budget")
    budget.add_argument("--window-hours", type=float, help="The run must end within this (p90).")
    budget.add_argument("--price-per-hour", type=float, help="GPU price per hour, for the cost.")
    search = parser.add_argument_group(
        "search (the study before the run: with either budget flag, its plan is printed)"
    )
    search.add_argument(
        "--search-hours", type=float, help="GPU-hours the study may spend before the run."
    )
    search.add_argument(
        "--search-budget-pct",
        type=float,
        help="The study's GPU-hours as a percentage of the run's p50 (with --search-hours: "
        "the smaller).",
    )
    search.add_argument("--n-trials", type=int, default=10, help="Trials asked for (default 10).")
    search.add_argument(
        "--trial-fraction",
        type=float,
        default=DEFAULT_TRIAL_FRACTION,
        help=f"Largest share of its full run a trial trains (default {DEFAULT_TRIAL_FRACTION}).",
    )
    search.add_argument(
        "--rungs",
        default=",".join(DEFAULT_RUNGS),
        help="Successive halving after the trials: K@F sends the K best on to F of their full "
        f"run (comma-separated; none: no rungs; default {','.join(DEFAULT_RUNGS)}).",
    )
    search.add_argument(
        "--trial-evals", type=int, default=6, help="Evaluations per trial (default 6)."
    )
    search.add_argument(
        "--promote",
        type=int,
        default=0,
        help="One rung of this many trials instead of --rungs (default 0): the plan keeps "
        "the promotions' time out of the budget first.",
    )
    search.add_argument(
        "--promote-fraction",
        type=float,
        default=0.3,
        help="Share of its full run a promoted trial trains (default 0.3).",
    )
    search.add_argument(
        "--workers",
        type=int,
        default=1,
        help="Worker processes of the study (default 1): the search budget counts the "
        "GPU-hours of all of them; wall clock is about GPU-hours / workers.",
    )


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    _check_numbers(args)
    if args.json:
        check_writable(args.json)
    gpu = _gpu(args)
    config_path = _config_path(args.model_config)
    config = load_model_config(config_path)
    from analysis.timemodel.machine import config_profile
    from search_spaces.families import space_for_model_type

    space = space_for_model_type(config.model_type, args.space)
    coefficients, source = coefficients_for(
        gpu, calibrations=args.calibration, tflops=args.gpu_tflops
    )
    max_length = _max_length(args, space, config)
    lengths, measured = _lengths(args, max_length)
    setup = RunSetup(
        attention=args.attention,
        lora_targets=args.lora_targets,
        logits_fp32=args.fp32_logits,
        memory_measure=args.memory_measure,
        longest_sample=args.longest_sample or (max(lengths) if args.data else None),
        packing=args.packing == "padding_free",
        group_by_length=args.packing == "group_by_length",
        lengths_vary=_lengths_vary(args, lengths, max_length),
        quantization=args.quantization,
        interconnect=args.interconnect,
    )
    model = config_profile(config, source=str(config_path), target_modules=setup.peft_targets)
    target = Target(
        model, lengths, gpu, coefficients, args.window_hours, setup, memory=_memory_terms()
    )
    chosen = _chosen(args, space, target, max_length)
    other = toggled_checkpointing(chosen, target)
    profiles = {
        name: best_of_profile(
            profile, target, lora_r=args.lora_r, epochs=args.epochs,
            max_length=args.max_length or (profile.max_length or max_length),
        )  # fmt: skip
        for name, profile in space.profiles.items()
    }
    report = plan_report(args, target, config, source, measured, (chosen, other), profiles)
    # A run too large for the GPU: the same batch at a smaller micro-batch and/or with
    # checkpointing (the base as trained), else on an NF4 base: the steps users take.
    remedy = memory_remedy(chosen, target)
    if remedy is not None:
        report["memory_remedy"] = remedy_report(remedy, chosen, args.price_per_hour)
    nf4 = nf4_instead(chosen, target)
    if nf4 is not None:
        report["nf4_base"] = remedy_report(nf4[0], chosen, args.price_per_hour, nf4=True)
    counts = _gpu_list(args.gpus)
    if counts != [1]:
        report["gpu_counts"] = gpu_count_report(
            *gpu_counts(chosen.shape, target, counts), args.price_per_hour
        )
        # Data parallelism copies the run to each GPU: what fits one GPU's memory fits each.
        fitting = (remedy, target, False) if remedy else (*nf4, True) if nf4 else None
        if report["gpu_counts"]["fastest"] is None and fitting is not None:
            fit, on, quantized = fitting
            report["gpu_counts"]["nf4_base" if quantized else "memory_remedy"] = {
                **gpu_count_report(*gpu_counts(fit.shape, on, counts), args.price_per_hour),
                "flags": remedy_flags(fit, chosen, nf4=quantized),
            }
    if args.search_hours is not None or args.search_budget_pct is not None:
        report["search"] = _search(args, chosen)
    for line in plan_lines(report):
        print(line)
    if args.json:
        write_json(args.json, report)
    return EXIT_OK


def _gpu_list(given: str) -> list[int]:
    """The GPU counts of `--gpus` (one, or several separated by commas)."""
    try:
        counts = sorted({int(part) for part in given.split(",") if part.strip()})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        raise BadInputError(f"--gpus must be counts >= 1 separated by commas, but got {given!r}")
    return counts


def _memory_terms() -> MemoryTerms:
    """The memory terms fitted to published runs, else the textbook ones."""
    from analysis.priors import fitted as fitted_priors

    fitted = fitted_priors.load()
    return fitted.memory if fitted is not None else MemoryTerms()


def _check_numbers(args: argparse.Namespace) -> None:
    for name in ("micro_batch_size", "gradient_accumulation_steps", "max_length", "lora_r",
                 "longest_sample"):  # fmt: skip
        value = getattr(args, name)
        if value is not None and value < 1:
            raise BadInputError(f"--{name.replace('_', '-')} must be >= 1, but got {value}")
    for name in ("n_trials", "trial_evals", "workers"):
        if getattr(args, name) < 1:
            raise BadInputError(
                f"--{name.replace('_', '-')} must be >= 1, but got {getattr(args, name)}"
            )
    if not 0 < args.trial_fraction <= 1:
        raise BadInputError(f"--trial-fraction must be in (0, 1], but got {args.trial_fraction}")
    if args.promote < 0 or (args.promote and not args.trial_fraction < args.promote_fraction <= 1):
        raise BadInputError(
            f"--promote must be >= 0 and --promote-fraction in (--trial-fraction, 1], but got "
            f"{args.promote} and {args.promote_fraction}"
        )
    if args.search_budget_pct is not None and not 0 < args.search_budget_pct <= 1000:
        raise BadInputError(
            f"--search-budget-pct must be in (0, 1000], but got {args.search_budget_pct}"
        )
    for name in ("window_hours", "epochs", "search_hours"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise BadInputError(f"--{name.replace('_', '-')} must be > 0, but got {value}")
    if args.price_per_hour is not None and args.price_per_hour < 0:
        raise BadInputError(f"--price-per-hour must be >= 0, but got {args.price_per_hour}")
    if (args.samples is None) == (args.data is None):
        raise BadInputError("give one of --samples N or --data FILE")


def _gpu(args: argparse.Namespace) -> GpuSpec:
    if args.gpu_tflops is not None or args.gpu_memory_gb is not None:
        if args.gpu_tflops is None or args.gpu_memory_gb is None:
            raise BadInputError("--gpu-tflops and --gpu-memory-gb go together")
        return custom_gpu(args.gpu, tflops=args.gpu_tflops, memory_gb=args.gpu_memory_gb)
    return find_gpu(args.gpu)


def _config_path(given: str) -> Path:
    shipped = shipped_configs()
    if given in shipped and not Path(given).exists():
        return shipped[given]
    return Path(given)


def _lengths(args: argparse.Namespace, max_length: int) -> tuple[tuple[int, ...], str]:
    for flag in ("data_columns", "validation_split"):
        if getattr(args, flag) and not args.data:
            raise BadInputError(f"--{flag.replace('_', '-')} reads --data, which is not given")
    if args.data:
        return lengths_from_data(
            args.data, max_length=max_length, tokenizer_dir=args.tokenizer,
            columns=args.data_columns, split=args.validation_split,
        )  # fmt: skip
    per_sample = args.tokens_per_sample or max_length
    how = "every sample full" if args.tokens_per_sample is None else "as given"
    return lengths_from_count(args.samples, per_sample), f"{per_sample} tokens per sample ({how})"


def _lengths_vary(args: argparse.Namespace, lengths: Sequence[int], max_length: int) -> bool:
    """Whether unpacked micro-batches change shape from step to step: measured lengths that
    differ, or a --tokens-per-sample under max_length (a mean: real samples spread around it)."""
    if args.data:
        return min(lengths) < max(lengths)
    return args.tokens_per_sample is not None and args.tokens_per_sample < max_length


def _max_length(args: argparse.Namespace, space: Any, config: Any) -> int:
    """The run's tokens per sample: --max-length, else the profile's own, else as a study
    sets it: the data's p99 token length within the model's context (with --data), else
    `DEFAULT_SHAPE`'s."""
    from trainers.data.dataset import long_tail_length

    profile = space.profiles.get(args.profile) if args.profile else None
    given = args.max_length or (profile.max_length if profile is not None else None)
    if given:
        return int(given)
    if not args.data:
        return DEFAULT_SHAPE.max_length
    context = getattr(config, "max_position_embeddings", None) or 2048
    whole, _ = _lengths(args, int(context))
    return long_tail_length(whole, int(context))


def _chosen(args: argparse.Namespace, space: Any, target: Target, max_length: int) -> Fit:
    """The run asked for: a profile's best choice, with any explicit value put over it."""
    if args.profile is not None:
        if args.profile not in space.profiles:
            raise BadInputError(
                f"--profile: unknown profile {args.profile!r}; known: {', '.join(space.profiles)}"
            )
        base = best_of_profile(
            space.profiles[args.profile], target, lora_r=args.lora_r, epochs=args.epochs,
            max_length=max_length,
        ).shape  # fmt: skip
    else:
        base = RunShape(**{
            **DEFAULT_SHAPE.__dict__, "epochs": args.epochs, "lora_r": args.lora_r,
            "max_length": max_length,
        })  # fmt: skip
    given = {
        name: getattr(args, name)
        for name in ("micro_batch_size", "gradient_accumulation_steps", "max_length",
                     "gradient_checkpointing")
        if getattr(args, name) is not None
    }  # fmt: skip
    shape = RunShape(**{**base.__dict__, **given})
    return target.evaluate(shape)


def _search(args: argparse.Namespace, chosen: Fit) -> dict[str, Any]:
    """The study's plan before the run (analysis.search.schedule), and both together."""
    from analysis.search.schedule import plan_search_for_run

    full = chosen.estimate
    plan = plan_search_for_run(
        full,
        search_hours=args.search_hours,
        search_budget_pct=args.search_budget_pct,
        n_trials=args.n_trials,
        max_fidelity=args.trial_fraction,
        evals=args.trial_evals,
        price_per_hour=args.price_per_hour or 0.0,
        workers=args.workers,
        promote=args.promote,
        promote_fraction=args.promote_fraction,
        rungs=() if args.promote else parse_rungs(tuple(args.rungs.split(",")), args.trial_fraction),
    )
    total_p90 = plan.planned_hours + full.seconds_p90 / 3600
    return {
        **plan.to_dict(),
        "lines": plan.lines(),
        "search_and_run_hours_p50": plan.planned_hours + full.seconds_p50 / 3600,
        "search_and_run_hours_p90": total_p90,
    }


if __name__ == "__main__":
    sys.exit(run_cli(main))
