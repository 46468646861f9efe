"""A step on N GPUs waits for the longest micro-batch: its padded length's spread, by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from analysis.timemodel.hardware import prior_coefficients
from analysis.timemodel.interconnect import expected_max_normal
from analysis.timemodel.model import padding_sd, predict
from tests.test_gpu_counts import CPU, _plan

# Only the tokens cost time (no fixed part, no attention), so a micro-step's time is
# proportional to its padded tokens.
TOKENS_ONLY = dataclasses.replace(
    prior_coefficients(CPU, cpu_probe=lambda: 40e9),
    micro_fixed_seconds=0.0,
    micro_seconds_per_attention_flop=0.0,
    step_noise_sd=0.0,
)


def test_one_sample_per_batch_of_two_lengths_varies_by_half() -> None:
    # Micro-batch 1 of lengths 50 and 150, half each: times 50 and 150 (x a rate): sd 50/100.
    plan = _plan(token_lengths=(50, 150) * 400, micro_batch_size=1, max_length=256)
    assert padding_sd(plan, TOKENS_ONLY, np.array(plan.token_lengths)) == pytest.approx(0.5)


def test_one_length_and_packed_rows_do_not_vary() -> None:
    same = _plan()  # 800 samples of 100 tokens
    assert padding_sd(same, TOKENS_ONLY, np.array(same.token_lengths)) == 0.0
    packed = _plan(token_lengths=(50, 150) * 400, packing="padding_free")
    assert padding_sd(packed, TOKENS_ONLY, np.array(packed.token_lengths)) == 0.0


def test_a_fixed_cost_per_micro_step_damps_the_spread() -> None:
    plan = _plan(token_lengths=(50, 150) * 400, micro_batch_size=1, max_length=256)
    lengths = np.array(plan.token_lengths)
    mean = predict(plan, TOKENS_ONLY).extra["micro_step_seconds"]
    damped = dataclasses.replace(TOKENS_ONLY, micro_fixed_seconds=mean)  # half the time fixed
    assert padding_sd(plan, damped, lengths) == pytest.approx(0.25)


def test_varied_lengths_make_the_step_wait_for_the_longest() -> None:
    plan = _plan(token_lengths=(50, 150) * 400, micro_batch_size=1, max_length=256,
                 gradient_accumulation_steps=4)  # fmt: skip
    one = predict(plan, TOKENS_ONLY)
    micro = one.extra["micro_step_seconds"]
    for gpus in (2, 8):
        many = predict(dataclasses.replace(plan, gpus=gpus), TOKENS_ONLY)
        # sd of a step = 0.5 x micro x sqrt(4 micro-steps); the wait: E[max of N] sd's.
        assert many.extra["straggler_seconds_each"] == pytest.approx(
            expected_max_normal(gpus) * 0.5 * micro * 2, rel=1e-9
        )
    same = predict(dataclasses.replace(_plan(), gpus=8), TOKENS_ONLY)
    assert same.extra["straggler_seconds_each"] == 0.0
