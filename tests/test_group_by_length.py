"""`packing: group_by_length`: micro-batches of samples of about one length, trained through
transformers' length-grouped sampler and priced by the time model as that sampler orders them."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers.trainer_pt_utils import get_length_grouped_indices

from analysis.timemodel.workload import epoch_averages, grouped_averages
from tests.test_packing import _plan as packing_plan
from trainers.data.dataset import load_tokenized
from trainers.data.paths import demo_data_path
from trainers.loop.run import train
from trainers.model.lora import load_tokenizer
from trainers.spec import LoraSpec, TrainSpec


def _library_mean_padded_tokens(lengths: np.ndarray, batch: int, group: int, seed: int) -> float:
    """Mean padded tokens per micro-batch in the order transformers' sampler makes."""
    order = get_length_grouped_indices(
        lengths.tolist(), group, generator=torch.Generator().manual_seed(seed)
    )
    ordered = lengths[order]
    starts = np.arange(0, ordered.size, batch)
    sizes = np.diff(np.append(starts, ordered.size))
    return float((np.maximum.reduceat(ordered, starts) * sizes).mean())


@pytest.mark.parametrize(("batch", "accumulation"), [(1, 1), (2, 8), (4, 4), (8, 1), (16, 2)])
def test_the_time_model_pads_as_transformers_groups(batch: int, accumulation: int) -> None:
    rng = np.random.default_rng(batch * 10 + accumulation)
    lengths = np.minimum(rng.lognormal(5.5, 0.8, 3000).astype(np.int64) + 8, 2048)
    predicted, _, padded = grouped_averages(lengths, batch, accumulation)
    library = np.mean(
        [
            _library_mean_padded_tokens(lengths, batch, batch * accumulation, seed)
            for seed in range(4)
        ]
    )
    # One seeded shuffle against the library's own order over four seeds: the padding of a
    # sorted mega-batch hardly depends on the shuffle (0.5 % apart at most when measured).
    assert predicted == pytest.approx(library, rel=0.02)
    assert padded.size == -(-lengths.size // batch)  # every micro-batch of the epoch
    shuffled = epoch_averages(lengths, lengths.size, batch)[0]
    if batch == 1:
        assert predicted == pytest.approx(shuffled)  # nothing to pad
    else:
        assert predicted < 0.9 * shuffled  # a sorted mega-batch pads less than any other cut


def test_one_process_takes_every_nth_micro_batch() -> None:
    """What the grouped straggler assumes: accelerate deals batch k to process k mod N."""
    from accelerate.data_loader import BatchSamplerShard

    batches = torch.utils.data.BatchSampler(range(64), batch_size=4, drop_last=False)
    every = list(batches)
    for rank in range(2):
        shard = BatchSamplerShard(batches, num_processes=2, process_index=rank)
        assert list(shard) == every[rank::2]


def _plan(packing: str, gpus: int, lengths: tuple[int, ...]) -> Any:
    """A 7B model's run at micro-batch 2 x 4 on these lengths (bf16 on CUDA)."""
    return dataclasses.replace(
        packing_plan(packing),
        token_lengths=lengths,
        micro_batch_size=2,
        gradient_accumulation_steps=4,
        max_length=2048,
        gpus=gpus,
    )


def test_grouping_cuts_the_padding_and_the_wait_for_the_slowest_gpu() -> None:
    from analysis.timemodel.hardware import HardwareInfo, prior_coefficients
    from analysis.timemodel.model import predict

    h100 = prior_coefficients(HardwareInfo("cuda", "NVIDIA H100", 80 * 2**30, 16, "bf16"))
    rng = random.Random(7)
    spread = tuple(min(int(rng.lognormvariate(5.5, 0.8)) + 8, 2048) for _ in range(4000))
    for gpus in (1, 8):
        plain, grouped = (
            predict(_plan(p, gpus, spread), h100) for p in ("none", "group_by_length")
        )
        assert grouped.optimizer_steps == plain.optimizer_steps  # the same samples per step
        assert grouped.train_tokens < 0.8 * plain.train_tokens
        assert grouped.breakdown["train"] < plain.breakdown["train"]
        assert grouped.peak_memory_bytes == plain.peak_memory_bytes  # the longest row is kept
        if gpus == 1:
            assert grouped.extra["straggler_seconds_each"] == plain.extra["straggler_seconds_each"]
        else:
            # Neighbours of a sorted mega-batch wait for each other far less than random ones.
            straggle = grouped.extra["straggler_seconds_each"]
            assert straggle < 0.5 * plain.extra["straggler_seconds_each"]
    # Samples of one length: nothing to group, the same plan.
    same = (300,) * 4000
    a, b = (predict(_plan(p, 8, same), h100) for p in ("none", "group_by_length"))
    assert b.seconds_p50 == pytest.approx(a.seconds_p50, rel=1e-9)


def test_a_grouped_run_pads_as_the_time_model_says(tiny_model_dir: Path, tmp_path: Path) -> None:
    data_file = tmp_path / "chat.jsonl"
    data_file.write_text("".join(demo_data_path("chat").read_text().splitlines(True)[:400]))
    spec = TrainSpec(
        model=str(tiny_model_dir),
        data=str(data_file),
        lora=LoraSpec(r=4, alpha=8),
        micro_batch_size=8,
        learning_rate=3e-3,
        epochs=1.0,
        max_length=128,
        eval_interval=0,
        eval_samples=16,
        packing="group_by_length",
        cache_dir=str(tmp_path / "cache"),
        output_dir=str(tmp_path / "out"),
    )
    result = train(spec)
    data = load_tokenized(spec.data_spec(), load_tokenizer(str(tiny_model_dir)))
    lengths = np.array([len(e.input_ids) for e in data.train])
    assert result.samples_seen == lengths.size
    measured = float(np.mean(result.micro_step_tokens))
    predicted = grouped_averages(lengths, 8, 1)[0]
    shuffled = epoch_averages(lengths, lengths.size, 8)[0]
    # Over 50 seeds of the library's sampler these lengths pad to within 2 % of the
    # prediction; shuffled micro-batches pad about 1.5x as much.
    assert measured == pytest.approx(predicted, rel=0.06)
    assert measured < 0.85 * shuffled
    assert result.train_losses[-1][1] < result.train_losses[0][1]


def test_the_plan_says_what_grouping_would_save(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from analysis.plan import main

    argv = ["--model-config", "llama-3.1-8b", "--gpu", "a100-80gb", "--max-length", "512"]
    argv += ["--data", str(demo_data_path("chat")), "--micro-batch-size", "8"]
    reports = {}
    for mode in ("none", "group_by_length", "padding_free"):
        out = tmp_path / f"{mode}.json"
        assert main([*argv, "--packing", mode, "--json", str(out)]) == 0
        reports[mode] = (capsys.readouterr().out, json.loads(out.read_text()))
    text, plain = reports["none"]
    grouped = plain["grouped_by_length"]
    # The line and the run it describes: the same run as --packing group_by_length plans.
    assert grouped["duration_hours"] == reports["group_by_length"][1]["plan"]["duration_hours"]
    assert grouped["train_tokens"] < plain["plan"]["train_tokens"]
    assert grouped["duration_hours"]["p50"] < plain["plan"]["duration_hours"]["p50"]
    assert "grouped by length (--packing group_by_length): p50" in text
    for mode in ("group_by_length", "padding_free"):  # nothing left to say
        assert reports[mode][1]["grouped_by_length"] is None
        assert "grouped by length" not in reports[mode][0]
