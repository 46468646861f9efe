from __future__ import annotations

import dataclasses
import itertools
import json
import math
from typing import Any

import numpy as np
import pytest

from analysis.timemodel.hardware import (
    HardwareInfo,
    cpu_matmul_flops,
    fingerprint,
    peak_flops,
    prior_coefficients,
)
from analysis.timemodel.model import Coefficients, ModelProfile, Plan, predict
from analysis.timemodel.workload import expected_padded_tokens
from common.errors import BadInputError
from trainers.spec import TrainSpec, optimizer_steps

MODEL = ModelProfile(
    total_parameters=5_000_000,
    n_layers=4,
    hidden_size=256,
    vocab_size=5000,
    lora_parameters_per_rank=8 * 512,
)
CPU = HardwareInfo("cpu", "Test CPU", 8 * 2**30, 2, "fp32")
LENGTHS = tuple(int(x) for x in np.random.default_rng(0).integers(20, 400, size=500))


def coefficients(**changes: Any) -> Coefficients:
    return dataclasses.replace(prior_coefficients(CPU, cpu_probe=lambda: 40e9), **changes)


def plan(**changes: object) -> Plan:
    base = Plan(
        model=MODEL,
        token_lengths=LENGTHS,
        epochs=2.0,
        micro_batch_size=4,
        gradient_accumulation_steps=4,
        max_length=256,
        lora_r=8,
        eval_interval_steps=0,
        eval_samples=64,
        checkpoint_interval_steps=0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("lengths", "batch", "max_length"),
    [((3, 1, 4, 1, 5, 9, 2, 6), 3, 7), ((5, 5, 5), 2, 10), ((1, 2, 3, 4), 4, 3), ((7, 2), 5, 9)],
)
def test_expected_padded_tokens_matches_enumeration(
    lengths: tuple[int, ...], batch: int, max_length: int
) -> None:
    clipped = [min(x, max_length) for x in lengths]
    b = min(batch, len(clipped))
    combos = list(itertools.combinations(range(len(clipped)), b))
    brute = sum(b * max(clipped[i] for i in combo) for combo in combos) / len(combos)
    assert expected_padded_tokens(lengths, batch, max_length) == pytest.approx(brute, rel=1e-12)


def test_optimizer_steps() -> None:
    assert predict(plan(), coefficients()).optimizer_steps == 2 * math.ceil(math.ceil(500 / 4) / 4)
    assert predict(plan(max_steps=7), coefficients()).optimizer_steps == 7
    assert predict(plan(epochs=0.5), coefficients()).optimizer_steps == math.ceil(0.5 * 32)


@pytest.mark.parametrize(
    ("samples", "micro_batch", "accumulation", "epochs", "steps"),
    [
        (500, 4, 4, 2.0, 64),  # 125 micro-batches -> 32 steps an epoch (a short last group)
        (7, 8, 4, 3.0, 3),  # fewer samples than one micro-batch: still a step an epoch
        (400, 4, 1, 0.1, 10),
        # 1.1 x 100 is 110.00000000000001 in floating point; the Trainer's ceil makes it 111
        # steps, so the time model counts 111 as well.
        (400, 4, 1, 1.1, 111),
    ],
)
def test_a_plan_and_its_train_spec_count_the_trainers_steps(
    samples: int, micro_batch: int, accumulation: int, epochs: float, steps: int
) -> None:
    spec = TrainSpec(
        model="m",
        data="d",
        micro_batch_size=micro_batch,
        gradient_accumulation_steps=accumulation,
        epochs=epochs,
    )
    the_plan = plan(
        token_lengths=LENGTHS[:samples],
        micro_batch_size=micro_batch,
        gradient_accumulation_steps=accumulation,
        epochs=epochs,
    )
    assert optimizer_steps(spec, samples) == steps
    assert predict(the_plan, coefficients()).optimizer_steps == steps


def test_evaluations_and_checkpoints_add_exactly_their_cost() -> None:
    c = coefficients()
    bare = predict(plan(), c)
    evals = predict(plan(eval_interval_steps=10), c)
    ckpts = predict(plan(checkpoint_interval_steps=16), c)
    # Every multiple of the interval, plus the last step (the Trainer evaluates and saves there).
    assert evals.n_evaluations == math.ceil(bare.optimizer_steps / 10)
    assert evals.seconds_p50 - bare.seconds_p50 == pytest.approx(
        evals.n_evaluations * evals.extra["eval_seconds_each"], rel=1e-9
    )
    assert ckpts.n_checkpoints == math.ceil(bare.optimizer_steps / 16)
    assert ckpts.seconds_p50 - bare.seconds_p50 == pytest.approx(
        ckpts.n_checkpoints * ckpts.extra["checkpoint_seconds_each"], rel=1e-9
    )
    assert ckpts.breakdown["checkpoint"] > 0 and bare.breakdown["checkpoint"] == 0


def test_doubling_epochs_doubles_train_time() -> None:
    c = coefficients()
    one, two = predict(plan(epochs=1.0), c), predict(plan(epochs=2.0), c)
    assert two.breakdown["train"] == pytest.approx(2 * one.breakdown["train"], rel=1e-9)
    assert two.breakdown["startup"] == one.breakdown["startup"]


def test_interval_is_ordered_and_wide_for_priors() -> None:
    est = predict(plan(), coefficients())
    assert est.seconds_p10 <= est.seconds_p50 <= est.seconds_p90
    assert est.seconds_p10 / est.seconds_p50 == pytest.approx(0.6, abs=0.01)
    assert est.seconds_p90 / est.seconds_p50 == pytest.approx(1.8, abs=0.02)


def test_noise_band_narrows_with_more_steps() -> None:
    c = coefficients(step_noise_sd=0.5, systematic_log_p10=-0.05, systematic_log_p90=0.05)

    def width(steps: int) -> float:
        e = predict(plan(max_steps=steps), c)
        assert e.seconds_p10 <= e.seconds_p50 <= e.seconds_p90
        return (e.seconds_p90 - e.seconds_p10) / e.seconds_p50

    widths = [width(s) for s in (2, 20, 200, 20_000)]
    assert widths == sorted(widths, reverse=True)
    assert widths[-1] == pytest.approx(2 * math.sinh(0.05), rel=0.02)  # systematic floor


def test_step_mean_ratio_scales_micro_steps() -> None:
    base = predict(plan(), coefficients())
    stalled = predict(plan(), coefficients(step_mean_ratio=1.2))
    assert stalled.extra["micro_step_seconds"] == pytest.approx(
        1.2 * base.extra["micro_step_seconds"]
    )


def test_gradient_checkpointing_trades_time_for_memory() -> None:
    c = coefficients()
    plain, gc = predict(plan(), c), predict(plan(gradient_checkpointing=True), c)
    assert gc.peak_memory_bytes < plain.peak_memory_bytes
    assert gc.breakdown["train"] > plain.breakdown["train"]


def test_memory_grows_with_micro_batch_and_rank() -> None:
    c = coefficients()
    mems = [predict(plan(micro_batch_size=b), c).peak_memory_bytes for b in (1, 2, 4, 8)]
    assert mems == sorted(mems) and len(set(mems)) == 4
    assert (
        predict(plan(lora_r=64), c).peak_memory_bytes > predict(plan(lora_r=4), c).peak_memory_bytes
    )
    assert predict(plan(precision="bf16"), c).peak_memory_bytes < mems[2]


def test_estimate_cost_and_dict() -> None:
    est = predict(plan(), coefficients())
    cost = est.cost(3.6)
    assert cost["p50"] == pytest.approx(est.seconds_p50 / 1000)
    assert cost["p10"] <= cost["p50"] <= cost["p90"]
    data = est.to_dict()
    json.dumps(data)
    assert set(est.breakdown) == {
        "startup",
        "data_loading",
        "warmup",
        "train",
        "eval",
        "checkpoint",
    }
    assert est.tokens_per_second > 0
    with pytest.raises(BadInputError):
        est.cost(-1.0)


@pytest.mark.parametrize(
    ("name", "precision", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
        ("NVIDIA H200", "bf16", 989e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12),
        ("NVIDIA A10G", "bf16", 125e12),
        ("NVIDIA L4", "bf16", 121e12),
        ("NVIDIA L40S", "bf16", 362e12),
        ("NVIDIA GeForce RTX 4090", "fp16", 165e12),
        ("Tesla V100-SXM2-16GB", "fp16", 125e12),
        ("Tesla T4", "fp16", 65e12),
        ("Some Future GPU", "bf16", 30e12),
    ],
)
def test_gpu_peak_table(name: str, precision: str, expected: float) -> None:
    assert peak_flops(HardwareInfo("cuda", name, 80 * 2**30, 16, precision)) == expected


def test_priors_follow_peak_flops() -> None:
    h100 = prior_coefficients(HardwareInfo("cuda", "NVIDIA H100", 80 * 2**30, 16, "bf16"))
    t4 = prior_coefficients(HardwareInfo("cuda", "Tesla T4", 16 * 2**30, 8, "fp16"))
    assert t4.micro_seconds_per_flop / h100.micro_seconds_per_flop == pytest.approx(989 / 65)
    cpu = prior_coefficients(CPU, cpu_probe=lambda: 100e9)
    assert cpu.micro_seconds_per_flop == pytest.approx(1 / 50e9)


def test_cpu_probe_measures_something() -> None:
    assert cpu_matmul_flops(seconds=0.02, size=64) > 1e6


def test_fingerprint() -> None:
    a = fingerprint(CPU, MODEL)
    assert a == fingerprint(HardwareInfo("cpu", "Test CPU", 1, 2, "fp32"), MODEL)  # memory ignored
    assert a != fingerprint(dataclasses.replace(CPU, device_name="Other CPU"), MODEL)
    assert a != fingerprint(dataclasses.replace(CPU, precision="bf16"), MODEL)
    assert a != fingerprint(CPU, dataclasses.replace(MODEL, n_layers=5))
    assert len(a) == 12


@pytest.mark.parametrize(
    "changes",
    [
        {"micro_batch_size": 0},
        {"token_lengths": ()},
        {"epochs": 0.0},
        {"precision": "fp8"},
        {"eval_interval_steps": -1},
        {"max_steps": 0},
        {"token_lengths": (3, 0)},
    ],
)
def test_bad_plans_raise(changes: dict[str, object]) -> None:
    with pytest.raises(BadInputError):
        plan(**changes)


def test_bad_hardware_raises() -> None:
    with pytest.raises(BadInputError, match="device_kind"):
        HardwareInfo("tpu", "x", 1, 1)
    with pytest.raises(BadInputError, match="hidden_size"):
        dataclasses.replace(MODEL, hidden_size=0)


def test_fused_attention_on_cuda_drops_score_memory() -> None:
    c = coefficients()
    eager = predict(plan(precision="bf16", device_kind="cpu"), c).peak_memory_bytes
    fused = predict(plan(precision="bf16", device_kind="cuda"), c).peak_memory_bytes
    assert fused < eager
