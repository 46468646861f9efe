"""A run on N GPUs in the time model and `analysis.plan --gpus`, against hand-computed numbers."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from analysis.planning.fits import RunShape, per_gpu_shape
from analysis.timemodel.hardware import prior_coefficients
from analysis.timemodel.interconnect import LINKS, allreduce_seconds, expected_max_normal
from analysis.timemodel.model import Plan, memory_breakdown, predict
from tests.cli import run_module
from tests.test_timemodel import CPU, MODEL


def _plan(**changes: object) -> Plan:
    # 800 samples of one length: every micro-batch is alike, so no step differs from another.
    base = Plan(
        model=MODEL,
        token_lengths=(100,) * 800,
        epochs=1.0,
        micro_batch_size=4,
        gradient_accumulation_steps=2,
        max_length=128,
        lora_r=8,
        eval_interval_steps=0,
        eval_samples=16,
        checkpoint_interval_steps=0,
        interconnect="pcie4",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_allreduce_by_hand() -> None:
    link = LINKS["pcie4"]  # 2e10 B/s bus bandwidth, 3 ms per step
    # 10M fp32 gradients on 4 GPUs: a ring sends 2 x 3/4 x 40 MB = 60 MB: 3 ms + 3 ms.
    assert allreduce_seconds(10_000_000, 4, link) == pytest.approx(6e-3, rel=1e-12)
    assert allreduce_seconds(10_000_000, 1, link) == 0.0
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=0.05)


def test_four_gpus_take_a_quarter_of_the_steps_plus_the_all_reduce_and_the_wait() -> None:
    c = dataclasses.replace(prior_coefficients(CPU, cpu_probe=lambda: 40e9), step_noise_sd=0.1)
    one, four = predict(_plan(), c), predict(_plan(gpus=4), c)
    # 800 samples at 4 x 2: 100 steps on one GPU; 50 micro-batches on each of four: 25 steps.
    assert (one.optimizer_steps, four.optimizer_steps) == (100, 25)
    micro = one.extra["micro_step_seconds"]
    assert four.extra["micro_step_seconds"] == pytest.approx(micro, rel=1e-12)
    allreduce = 3e-3 + 2 * 3 / 4 * (8 * 8 * 512) * 4 / 2e10
    straggler = expected_max_normal(4) * 0.1 * micro * math.sqrt(2)
    assert four.extra["allreduce_seconds_each"] == pytest.approx(allreduce, rel=1e-12)
    assert four.extra["straggler_seconds_each"] == pytest.approx(straggler, rel=1e-12)
    expected = one.breakdown["train"] / 4 + 25 * (allreduce + straggler)
    assert four.breakdown["train"] == pytest.approx(expected, rel=1e-12)
    # Every GPU is paid for the whole run.
    assert four.cost(2.5)["p50"] == pytest.approx(4 * 2.5 * four.seconds_p50 / 3600, rel=1e-12)
    assert four.train_tokens == pytest.approx(one.train_tokens, rel=1e-12)
    # Each GPU scores 4 of the 16 validation samples, in one batch of 8 (one GPU: 2 batches).
    fixed, per_batch = c.eval_fixed_seconds, c.eval_seconds_per_batch
    per_token = c.eval_seconds_per_flop * 2.0 * MODEL.compute_parameters * 100
    assert one.extra["eval_seconds_each"] == pytest.approx(
        fixed + 2 * per_batch + 16 * per_token, rel=1e-12
    )
    assert four.extra["eval_seconds_each"] == pytest.approx(
        fixed + per_batch + 4 * per_token, rel=1e-12
    )


def test_memory_per_gpu_adds_the_ddp_buckets() -> None:
    c = prior_coefficients(CPU, cpu_probe=lambda: 40e9)
    one, two = memory_breakdown(_plan(), c), memory_breakdown(_plan(gpus=2), c)
    assert one["ddp_buckets"] == 0.0
    assert two["ddp_buckets"] == 4 * 8 * 8 * 512  # fp32 gradients of the rank-8 adapter
    assert {k: v for k, v in two.items() if k != "ddp_buckets"} == {
        k: v for k, v in one.items() if k != "ddp_buckets"
    }


@pytest.mark.parametrize(
    ("micro", "accumulation", "gpus", "per_gpu"),
    [
        (4, 4, 1, (4, 4)),
        (4, 4, 2, (4, 2)),
        (4, 4, 4, (4, 1)),
        (4, 4, 8, (2, 1)),  # the micro-batch shrinks: the effective batch stays 16
        (16, 2, 4, (8, 1)),
        (3, 1, 2, (3, 1)),  # neither divides: 6 samples per step instead of 3
    ],
)
def test_per_gpu_shape(micro: int, accumulation: int, gpus: int, per_gpu: tuple[int, int]) -> None:
    shape = per_gpu_shape(RunShape(micro, accumulation, 512, 16), gpus)
    assert (shape.micro_batch_size, shape.gradient_accumulation_steps, shape.gpus) == (
        *per_gpu,
        gpus,
    )


def test_plan_for_the_38_hour_run_picks_the_smallest_gpu_count_inside_12_hours(
    tmp_path: Path,
) -> None:
    out = tmp_path / "plan.json"
    args = ["--model-config", "mistral-7b-v0.1", "--gpu", "H100", "--samples", "600000"]
    args += ["--epochs", "3", "--window-hours", "12", "--price-per-hour", "2.5"]
    done = run_module("analysis.plan", *args, "--gpus", "8,1,4,2", "--json", out)
    assert done.returncode == 0, done.stderr
    counts = json.loads(out.read_text())["gpu_counts"]
    runs = {run["gpus"]: run for run in counts["runs"]}
    assert sorted(runs) == [1, 2, 4, 8]
    for n, run in runs.items():
        hours = run["duration_hours"]
        assert run["fits_window"] == (hours["p90"] <= 12)
        assert run["cost"]["p50"] == pytest.approx(n * 2.5 * hours["p50"], rel=1e-9)
    # More GPUs end sooner, but never for fewer GPU-hours (the all-reduce and the wait).
    p90 = [runs[n]["duration_hours"]["p90"] for n in (1, 2, 4, 8)]
    assert p90 == sorted(p90, reverse=True)
    gpu_hours = [runs[n]["gpu_hours_p90"] for n in (1, 2, 4, 8)]
    assert gpu_hours == sorted(gpu_hours)
    fitting = [n for n in (1, 2, 4, 8) if runs[n]["fits"]]
    assert counts["cheapest"] == min(fitting) and counts["fastest"] == max(fitting)
    assert "cheapest that fits" in done.stdout


@pytest.mark.parametrize("gpus", ["0", "two", ""])
def test_bad_gpu_counts_are_bad_input(gpus: str) -> None:
    done = run_module(
        "analysis.plan", "--model-config", "mistral-7b-v0.1", "--gpu", "H100",
        "--samples", "1000", "--gpus", gpus,
    )  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "--gpus" in line
