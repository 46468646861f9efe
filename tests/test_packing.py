"""Padding-free packing: no attention crosses a sample boundary, and a packed run trains."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from common.errors import BadInputError
from trainers.data.dataset import DataSpec, Example, load_tokenized
from trainers.data.packing import (
    PackedSequence,
    PaddingFreeCollator,
    pack_examples,
    pack_lengths,
    padding_share,
    samples_in,
)
from trainers.data.paths import demo_data_path
from trainers.loop.run import train
from trainers.loop.trainer_setup import PadCollator
from trainers.model.lora import apply_lora, load_base_model, load_tokenizer
from trainers.spec import LoraSpec, TrainSpec


@pytest.mark.parametrize("max_length", [16, 64, 128])
def test_pack_lengths_puts_every_sample_once_within_max_length(max_length: int) -> None:
    rng = random.Random(max_length)
    lengths = [rng.randint(1, max_length) for _ in range(500)]
    bins = pack_lengths(lengths, max_length)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= max_length for b in bins)
    fewest = math.ceil(sum(lengths) / max_length)
    assert fewest <= len(bins) <= math.ceil(11 / 9 * fewest) + 1
    assert pack_lengths(lengths, max_length) == bins  # deterministic
    # Packed once per lengths (a cache): a caller changing its copy changes no other's.
    bins[0].append(-1)
    assert pack_lengths(lengths, max_length) != bins
    assert pack_lengths(tuple(lengths), max_length) == pack_lengths(lengths, max_length)


def test_padding_share_counts_padded_slots() -> None:
    assert padding_share([4, 4, 4, 4], 2) == 0.0
    assert padding_share([1, 3, 2, 2], 2) == pytest.approx(2 / 10)


def test_packing_needs_truncation(tiny_model_dir: Path) -> None:
    with pytest.raises(BadInputError, match="overflow=truncate"):
        TrainSpec(
            model=str(tiny_model_dir), data="x.jsonl", packing="padding_free", overflow="pack"
        )
    with pytest.raises(BadInputError, match="packing"):
        TrainSpec(model=str(tiny_model_dir), data="x.jsonl", packing="bins")


def _per_sample_loss_sums(model: torch.nn.Module, batch: dict, rows: list[int]) -> list[float]:
    """Summed next-token loss of each sample; `rows` gives each sample's token count."""
    batch = dict(batch)
    labels = batch.pop("labels")
    with torch.no_grad():
        logits = model(**batch).logits.float()
    losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]),
        labels[:, 1:].reshape(-1),
        reduction="none",
        ignore_index=-100,
    )
    width = labels.shape[1] - 1
    losses = losses.reshape(labels.shape[0], width)
    if labels.shape[0] > 1:  # one sample per row
        return [float(row.sum()) for row in losses]
    out, start = [], 0
    for n in rows:  # one row, samples back to back; a sample's last position predicts
        out.append(float(losses[0, start : start + n - 1].sum()))  # nothing of its own
        start += n
    return out


@pytest.fixture(scope="module")
def chat_examples(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Example]:
    tokenizer = load_tokenizer(str(tiny_model_dir))
    spec = DataSpec(
        path=str(demo_data_path("chat")),
        max_length=128,
        cache_dir=str(tmp_path_factory.mktemp("cache")),
    )
    return load_tokenized(spec, tokenizer).train[:6]


@pytest.mark.parametrize("arch", ["llama", "gpt_neox", "qwen2"])
def test_packed_losses_equal_samples_alone(
    arch: str, chat_examples: list[Example], tmp_path_factory: pytest.TempPathFactory
) -> None:
    from trainers.tiny import build_tiny

    folder = build_tiny(tmp_path_factory.mktemp(arch) / arch, arch=arch, size="xs")
    tokenizer = load_tokenizer(str(folder))
    model, _ = apply_lora(load_base_model(str(folder)), LoraSpec(r=4, dropout=0.0))
    model.train()  # as in training: no dropout anywhere (LoRA dropout 0, tiny configs 0)
    examples = chat_examples
    assert all(any(label != -100 for label in e.labels) for e in examples)
    lengths = [len(e.input_ids) for e in examples]
    pad = PadCollator(int(tokenizer.pad_token_id))
    alone = [
        _per_sample_loss_sums(model, pad([e]), [n])[0]
        for e, n in zip(examples, lengths, strict=True)
    ]
    packed_batch = PaddingFreeCollator()(
        [PackedSequence(tuple(examples[:3])), PackedSequence(tuple(examples[3:]))]
    )
    assert packed_batch["input_ids"].shape == (1, sum(lengths))
    assert samples_in(packed_batch) == len(examples)
    packed = _per_sample_loss_sums(model, packed_batch, lengths)
    targets = [sum(label != -100 for label in e.labels[1:]) for e in examples]
    for a, p, t in zip(alone, packed, targets, strict=True):
        assert abs(a - p) / t < 1e-5, (arch, a, p)
    # The check can fail: the same row with positions running on (plain concatenation)
    # lets later samples attend to earlier ones.
    leaky = dict(packed_batch, position_ids=torch.arange(sum(lengths))[None])
    crossed = _per_sample_loss_sums(model, leaky, lengths)
    assert (
        max(abs(a - c) / t for a, c, t in zip(alone[1:], crossed[1:], targets[1:], strict=True))
        > 1e-3
    )


def test_packed_run_trains_on_real_tokens(tiny_model_dir: Path, tmp_path: Path) -> None:
    data_file = tmp_path / "chat.jsonl"
    data_file.write_text("".join(demo_data_path("chat").read_text().splitlines(True)[:120]))
    common: dict[str, Any] = {
        "model": str(tiny_model_dir),
        "data": str(data_file),
        "lora": LoraSpec(r=8, alpha=16),
        "learning_rate": 3e-3,
        "epochs": 1.0,
        "max_length": 128,
        "eval_interval": 0,
        "eval_samples": 16,
        "cache_dir": str(tmp_path / "cache"),
    }
    packed = train(
        TrainSpec(
            **common, output_dir=str(tmp_path / "p"), micro_batch_size=2, packing="padding_free"
        )
    )
    padded = train(TrainSpec(**common, output_dir=str(tmp_path / "d"), micro_batch_size=8))
    tokenizer = load_tokenizer(str(tiny_model_dir))
    data = load_tokenized(TrainSpec(**common).data_spec(), tokenizer)
    real = sum(len(e.input_ids) for e in data.train)
    sequences = len(pack_examples(data.train, 128))
    assert packed.optimizer_steps == math.ceil(sequences / 2)
    assert sequences < len(data.train) / 3  # chat samples are short: several per sequence
    assert packed.samples_seen == padded.samples_seen == len(data.train)
    assert packed.tokens_seen == real < padded.tokens_seen  # no padding counted (nor trained)
    assert packed.train_losses[-1][1] < packed.train_losses[0][1] - 0.3
    # Validation is never packed: the same samples, scored the same way (fewer, larger
    # optimizer steps learn less in one epoch at one learning rate; both learn).
    assert packed.final_eval_loss is not None and padded.final_eval_loss is not None
    assert packed.final_eval_loss < packed.train_losses[0][1] - 0.3
    assert padded.final_eval_loss < padded.train_losses[0][1] - 0.3


def _plan(packing: str, device: str = "cuda", precision: str = "bf16") -> Any:
    from analysis.timemodel.model import ModelProfile, Plan

    rng = random.Random(1)
    return Plan(
        # 7B parameters, 32 layers of 4096, a vocabulary of 32k; 4M LoRA parameters per rank.
        model=ModelProfile(7_000_000_000, 32, 4096, 32000, 4_000_000),
        token_lengths=tuple(rng.randint(20, 120) for _ in range(4000)),
        epochs=1.0,
        micro_batch_size=8,
        gradient_accumulation_steps=1,
        max_length=512,
        lora_r=16,
        eval_interval_steps=0,
        eval_samples=0,
        checkpoint_interval_steps=0,
        precision=precision,
        device_kind=device,
        packing=packing,
    )


def test_time_model_counts_packed_sequences_and_real_tokens() -> None:
    from analysis.timemodel.hardware import HardwareInfo, prior_coefficients
    from analysis.timemodel.model import predict

    padded, packed = _plan("none"), _plan("padding_free")
    h100 = prior_coefficients(HardwareInfo("cuda", "NVIDIA H100", 80 * 2**30, 16, "bf16"))
    a, b = predict(padded, h100), predict(packed, h100)
    sequences = len(pack_lengths(list(packed.token_lengths), 512))
    real = sum(packed.token_lengths)
    assert a.optimizer_steps == 500
    assert b.optimizer_steps == math.ceil(sequences / 8) < a.optimizer_steps / 5
    assert b.train_tokens == pytest.approx(real, rel=0.02)  # no padding trained
    assert a.train_tokens > 1.3 * real  # padded batches: a sixth or more is padding
    assert b.breakdown["train"] < a.breakdown["train"]
    # Memory follows the packed row: micro_batch x max_length tokens, more than padded rows
    # of ~120 tokens.
    assert b.peak_memory_bytes > a.peak_memory_bytes


def test_plan_cli_packing_cuts_steps(capsys: pytest.CaptureFixture[str]) -> None:
    from analysis.plan import main

    lines = {}
    for mode in ("none", "padding_free"):
        argv = ["--model-config", "llama-3.1-8b", "--gpu", "a100-80gb", "--max-length", "512"]
        argv += ["--data", str(demo_data_path("chat")), "--micro-batch-size", "8"]
        assert main([*argv, "--packing", mode]) == 0
        lines[mode] = capsys.readouterr().out
    steps = {
        m: int(out.split(" optimizer steps")[0].rsplit(", ", 1)[1]) for m, out in lines.items()
    }
    assert steps["padding_free"] < steps["none"] / 4
    assert "packed" in lines["padding_free"]


def test_nf4_plan_fits_an_8b_model_on_a_24gb_card(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from analysis.plan import main

    argv = ["--model-config", "llama-3.1-8b", "--gpu", "rtx4090", "--samples", "2000"]
    argv += ["--max-length", "512", "--micro-batch-size", "4", "--gradient-checkpointing"]
    out = {}
    for mode in ("none", "nf4"):
        assert main([*argv, "--quantization", mode, "--json", str(tmp_path / f"{mode}.json")]) == 0
        out[mode] = capsys.readouterr().out
    weights = {m: float(o.split("weights ")[1].split(",")[0]) for m, o in out.items()}
    # 8.0 B weights: 15 GiB in bf16; NF4 for the 7 B in linear layers (~0.52 byte each)
    # and the two 0.5 B embeddings in fp32, where PEFT's kbit preparation leaves them
    # (3.4 + 3.7 GiB): about half.
    assert 14.5 < weights["none"] < 15.5
    assert 6.5 < weights["nf4"] < 8.0
    assert "NF4 base" in out["nf4"]
    assert "fits: yes" in out["nf4"] and "fits: no" in out["none"]
    p50 = {m: o.split("p50 ")[1].split(",")[0] for m, o in out.items()}
    assert p50["nf4"] != p50["none"]  # de-quantization makes the steps slower


def test_packed_attention_is_priced_as_the_trainer_runs_it() -> None:
    """SDPA with the block-diagonal mask computes whole rows, on a GPU too (not per sample)."""
    import dataclasses

    from analysis.timemodel.hardware import HardwareInfo, prior_coefficients
    from analysis.timemodel.model import predict
    from analysis.timemodel.workload import attention_flops
    from trainers.model.runtime import ATTENTION_KERNEL, per_sample_attention

    assert ATTENTION_KERNEL == "sdpa" and not per_sample_attention()
    assert per_sample_attention("flash_attention_2")
    packed = _plan("padding_free")
    h100 = prior_coefficients(HardwareInfo("cuda", "NVIDIA H100", 80 * 2**30, 16, "bf16"))
    slower = dataclasses.replace(
        h100, micro_seconds_per_attention_flop=2 * h100.micro_seconds_per_attention_flop
    )
    a, b = predict(packed, h100), predict(packed, slower)
    micro_steps = a.optimizer_steps * packed.gradient_accumulation_steps
    row = a.train_tokens / micro_steps  # real tokens of one packed micro-batch
    whole_rows = attention_flops(packed.model, row**2, False) * micro_steps
    added = b.breakdown["train"] - a.breakdown["train"]
    # The added time is the whole rows' attention; per-sample blocks (~80-token samples in
    # 512-token rows) would be about 6x less.
    assert added == pytest.approx(whole_rows * h100.micro_seconds_per_attention_flop, rel=0.05)
