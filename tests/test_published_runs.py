"""The published LoRA runs the plan's priors are fitted to and checked against."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from analysis.planning.inputs import load_model_config, shipped_configs
from analysis.priors.fit import replay_with, setup_of
from analysis.priors.fitted import load, stored_profiles
from analysis.priors.published_runs import PUBLISHED_RUNS, expressible_runs
from analysis.timemodel.gpus import find_gpu
from analysis.timemodel.machine import config_profile
from analysis.timemodel.run_setup import ATTENTION_KERNELS, MEMORY_MEASURES, RunSetup

ROOT = Path(__file__).resolve().parents[1]

TIME_MEASURES = ("s/it", "tokens/s", "s per 250 steps")


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=lambda r: r.name)
def test_every_row_names_its_source_setup_and_measure(run: object) -> None:
    from analysis.priors.published_runs import PublishedRun

    assert isinstance(run, PublishedRun)
    # A published page, or this project's own measurement file (benchmarks/gpu_scale.py).
    assert run.source.startswith("https://") or (ROOT / run.source).is_file(), run.source
    assert run.where.strip()
    assert run.model in shipped_configs(), f"{run.model}: ship its config.json"
    assert run.framework and run.precision in ("bf16", "fp16", "fp32")
    assert run.micro_batch_size >= 1 and run.gradient_accumulation_steps >= 1
    assert 0 < run.tokens_per_sample <= run.max_length
    assert run.attention in ATTENTION_KERNELS and run.lora_r >= 1 and run.lora_targets
    assert run.time_measure in TIME_MEASURES and run.memory_measure in MEMORY_MEASURES
    assert run.memory_gib > 0
    if run.expressible:
        find_gpu(run.gpu)  # a known GPU (raises otherwise)
        if math.isnan(run.time_value):  # fitted and checked for memory alone, and says why
            assert "Speed not compared" in run.notes
        else:
            assert math.isfinite(run.time_value) and run.time_value > 0
            assert run.seconds_per_step > 0
    else:
        assert run.why_not, "a row the plan cannot express says why"


def test_table_covers_gpus_lengths_and_keeps_points_out() -> None:
    runs = expressible_runs()
    assert len(runs) >= 12
    assert len({r.gpu for r in runs}) >= 4
    lengths = {r.max_length for r in runs}
    assert min(lengths) <= 512 and max(lengths) >= 8192
    held_out = [r for r in runs if r.held_out]
    assert 0 < len(held_out) < len(runs)
    priors = load()
    assert priors is not None, "run python -m benchmarks.published_runs --write-priors"
    assert not {r.name for r in held_out} & set(priors.fitted_points)
    # The speed was fitted to the rows with a published one; memory to them all.
    timed = {r.name for r in runs if not r.held_out and math.isfinite(r.time_value)}
    assert set(priors.timed_points) == timed < set(priors.fitted_points)


def test_stored_profiles_are_the_shipped_configs() -> None:
    """The profiles stored with the fit are what the meta-device build gives (one checked)."""
    stored = stored_profiles()
    key = ("qwen-1.8b", "auto")
    built = config_profile(load_model_config(shipped_configs()["qwen-1.8b"]), target_modules="auto")
    assert stored[key] == built


def test_memory_p90_holds_the_published_peaks() -> None:
    """Every fitted peak by construction; held-out peaks (models and points the fit never
    saw) nine in ten, none more than 10 % above p90."""
    priors = load()
    assert priors is not None
    cache = stored_profiles()
    held_out = []
    for run in expressible_runs():
        assert (run.model, setup_of(run).peft_targets) in cache, run.name
        replay = replay_with(run, priors, cache)
        assert replay.seconds_p10 <= replay.seconds_p50 <= replay.seconds_p90
        if run.held_out:
            held_out.append(replay.memory_p90_gib / run.memory_gib)
        else:
            assert replay.memory_p90_gib >= run.memory_gib, run.name
    assert sum(ratio >= 1.0 for ratio in held_out) >= 0.9 * len(held_out)
    assert min(held_out) >= 0.9


def test_setup_fields_move_memory_the_way_published_tables_do() -> None:
    """Eager attention adds quadratic memory, fp32 logits and reserved memory add more."""
    import dataclasses

    from analysis.planning.fits import RunShape, plan_of_shape
    from analysis.planning.inputs import lengths_from_count
    from analysis.timemodel.run_setup import MemoryTerms, peak_memory

    model = stored_profiles()[("qwen-7b", "auto")]
    gpu = find_gpu("A100-80GB")
    terms = MemoryTerms()

    def peak(length: int, **setup: Any) -> float:
        shape = RunShape(1, 8, length, 64, True)
        plan = plan_of_shape(shape, model, lengths_from_count(16, length), gpu)
        return peak_memory(plan, dataclasses.replace(RunSetup(), **setup), terms)[0]

    # Eager: the extra memory over a flash kernel grows 4x when the length doubles.
    extra = [
        peak(n, attention="eager") - peak(n, attention="flash_attention_2") for n in (2048, 4096)
    ]
    assert extra[1] == pytest.approx(4 * extra[0], rel=1e-6)
    assert peak(4096, logits_fp32=False) < peak(4096)
    assert peak(4096, memory_measure="allocated") < peak(4096)
    assert peak(4096, longest_sample=1024) < peak(4096)


def test_lengths_that_vary_reserve_more_only_where_the_allocator_keeps_blocks() -> None:
    """Micro-batches of changing shapes add the fitted share of activations and logits to the
    reserved peak; not to allocated memory, and not to packed rows (always max_length)."""
    from analysis.planning.fits import RunShape, plan_of_shape
    from analysis.planning.inputs import lengths_from_count
    from analysis.timemodel.run_setup import memory_parts

    priors = load()
    assert priors is not None and priors.memory.varied_length_reserve > 0
    model = stored_profiles()[("qwen-7b", "auto")]
    plan = plan_of_shape(
        RunShape(1, 8, 4096, 64, True), model, lengths_from_count(16, 4096), find_gpu("A100-80GB")
    )

    def parts(**setup: Any) -> dict[str, float]:
        return memory_parts(plan, dataclasses.replace(RunSetup(), **setup), priors.memory)

    varied, whole = parts(lengths_vary=True), parts()
    shaped = whole["activations"] + whole["logits"]
    assert varied["varied_length_reserve"] == pytest.approx(
        priors.memory.varied_length_reserve * shaped
    )
    assert sum(varied.values()) > sum(whole.values())
    assert whole["varied_length_reserve"] == 0.0
    assert parts(lengths_vary=True, memory_measure="allocated")["varied_length_reserve"] == 0.0
    assert parts(lengths_vary=True, packing=True)["varied_length_reserve"] == 0.0


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--lora-targets", ","], "--lora-targets"),
        (["--longest-sample", "0"], "--longest-sample must be >= 1"),
        (["--attention", "paged"], "--attention"),
    ],
)
def test_bad_setup_field_exits_2_naming_it(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from analysis.plan import main
    from common.cli import run_cli

    argv = ["--model-config", "tinyllama-1.1b", "--gpu", "A100-80GB", "--samples", "100"]
    try:
        code = run_cli(main, [*argv, *flags])
    except SystemExit as exc:  # argparse's own choices check exits 2 itself
        code = int(exc.code or 0)
    assert code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # argparse prints its usage first
    assert expected in last


def test_a_gpu_without_points_borrows_its_generations_speed() -> None:
    import dataclasses

    from analysis.timemodel.gpus import custom_gpu

    priors = load()
    assert priors is not None
    fitted = dict(priors.utilisation)
    # Two generations with different fitted speeds, so that borrowing is visible.
    priors = dataclasses.replace(
        priors, utilisation={"H100": 0.4, "A100-80GB": 0.9, "L40S": 0.7}, pooled_utilisation=0.8
    )
    assert priors.utilisation_for(find_gpu("H100")) == 0.4
    assert priors.utilisation_for(find_gpu("H200")) == 0.4  # Hopper, as the H100
    assert priors.utilisation_for(find_gpu("A100-40GB")) == 0.9  # Ampere, as the A100-80GB
    assert priors.utilisation_for(find_gpu("L4")) == 0.7  # Ada, as the L40S
    assert priors.utilisation_for(find_gpu("T4")) == 0.8  # no Turing points: pooled
    assert priors.utilisation_for(custom_gpu("X", tflops=100, memory_gb=40)) == 0.8
    assert priors.utilisation_source(find_gpu("H200")) == "its generation's (hopper)"
    assert priors.utilisation_source(find_gpu("H100")) == "its"
    assert priors.utilisation_source(find_gpu("T4")) == "the pooled"
    assert fitted  # the stored fit has points of its own


def test_a_row_on_several_gpus_replays_through_the_plans_data_parallel_terms() -> None:
    """A row's `gpus` reaches the plan: per GPU the same step plus the all-reduce, memory per
    GPU plus DDP's fp32 gradient bucket; rows on several GPUs are summarised apart."""
    from benchmarks.published_runs import evaluate_rows, summary

    priors = load()
    assert priors is not None
    cache = stored_profiles()
    run = next(r for r in expressible_runs() if r.model == "mistral-7b-v0.1")
    one = replay_with(run, priors, cache)
    four = replay_with(dataclasses.replace(run, gpus=4), priors, cache)
    model = cache[(run.model, setup_of(run).peft_targets)]
    gradient_gib = 4 * run.lora_r * model.lora_parameters_per_rank / 2**30
    assert 0 < four.seconds_p50 - one.seconds_p50 < 0.05 * one.seconds_p50
    assert four.memory_p50_gib - one.memory_p50_gib == pytest.approx(gradient_gib, rel=0.05)
    _, rows = evaluate_rows(cache=cache)
    several = summary(rows)["several_gpus"]
    # No published single-node DDP row yet: the Qwen README's 2 x 2 GPU rows are apart.
    assert several["held_out"]["points"] == several["in_sample"]["points"] == 0
    assert len(several["apart"]) == 6 and all("multinode" in n for n in several["apart"])


def test_the_fit_finds_the_share_of_lengths_that_vary_it_was_given() -> None:
    """Peaks made by known memory terms (the share 0.6, not the fitted 1.04) give those terms
    back, and a p90 no wider than the fit's margin: nothing is left to bound."""
    from analysis.priors.fit import MEMORY_MARGIN, fit
    from analysis.priors.fitted import GIB
    from analysis.timemodel.run_setup import MemoryTerms, peak_memory

    priors = load()
    assert priors is not None
    cache = stored_profiles()
    truth = dataclasses.replace(
        MemoryTerms(), activation_scale=1.1, logits_fp32_bytes=11.0, fixed_bytes=1.5 * GIB,
        reserved_over_allocated=1.05, varied_length_reserve=0.6,
    )  # fmt: skip
    from analysis.priors.fit import _memory_plan

    runs = []
    for run in expressible_runs():
        if run.held_out:
            continue
        plan = _memory_plan(run, cache[(run.model, setup_of(run).peft_targets)])
        made = peak_memory(plan, setup_of(run), truth)[0] / GIB
        runs.append(dataclasses.replace(run, memory_gib=made))
    assert any(run.lengths_vary for run in runs) and not all(run.lengths_vary for run in runs)
    got = fit(runs, cache).memory
    assert got.varied_length_reserve == pytest.approx(0.6, abs=0.1)
    assert got.activation_scale == pytest.approx(1.1, rel=0.1)
    assert got.log_p90 < MEMORY_MARGIN + 0.05


def test_padding_free_rows_replay_the_whole_rows_scores() -> None:
    """A padding-free run (one row of micro-batch x max_length, SDPA computing the whole
    row's scores under its block-diagonal mask) plans slower than whole rows of its shape,
    and this project's two measured on an H100 land inside the plan's band."""
    priors = load()
    assert priors is not None
    cache = stored_profiles()
    free = [run for run in expressible_runs() if run.padding_free]
    assert len(free) == 2 and all(run.held_out for run in free)  # the fit never saw them
    for run in free:
        replay = replay_with(run, priors, cache)
        whole = replay_with(dataclasses.replace(run, padding_free=False), priors, cache)
        assert replay.seconds_p50 > whole.seconds_p50
        assert replay.seconds_p10 <= run.seconds_per_step <= replay.seconds_p90, run.name
