"""What a run's steps cost in work: tokens per micro-batch, FLOPs, and bytes of memory.

The physical features the time model (`analysis.timemodel.model`) turns into seconds and bytes
with its coefficients, and that a calibration (`analysis.calibration`) fits them to: the
padded tokens of a micro-batch under dynamic padding or packing, the matmul FLOPs of the
frozen weights, the adapters and attention, and the memory of weights, adapters, optimizer
state and activations. Pure numpy: importable without torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from trainers.data.packing import pack_lengths

PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


class ModelSize(Protocol):
    """The sizes of a model the features read (`analysis.timemodel.model.ModelProfile`)."""

    @property
    def total_parameters(self) -> int: ...

    @property
    def n_layers(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...


def _max_pmf(lengths: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct lengths and P(max of `batch` distinct samples drawn uniformly = each).

    A shuffled epoch cut into micro-batches makes each micro-batch a uniform random subset,
    so P(max <= v) = C(#{l <= v}, b) / C(n, b), computed as a product to stay finite.
    """
    n = lengths.size
    batch = min(batch, n)
    values, counts = np.unique(lengths, return_counts=True)
    below = np.cumsum(counts).astype(np.float64)
    j = np.arange(batch, dtype=np.float64)
    terms = np.clip((below[:, None] - j) / (n - j), 0.0, None)
    cdf = np.prod(terms, axis=1)
    return values.astype(np.float64), np.diff(cdf, prepend=0.0)


def padded_length_pmf(lengths: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The padded lengths a micro-batch of `batch` samples can have, and their probabilities."""
    return _max_pmf(lengths, batch)


def _max_moments(lengths: np.ndarray, batch: int) -> tuple[float, float]:
    """E[max] and E[max^2] of the lengths of `batch` distinct samples drawn uniformly."""
    v, pmf = _max_pmf(lengths, batch)
    return float(pmf @ v), float(pmf @ v**2)


def expected_new_shapes(lengths: np.ndarray, batch: int, micro_steps: int) -> float:
    """Expected distinct padded lengths among `micro_steps` micro-batches of `batch` samples.

    A micro-batch is padded to its longest sample, so its shape is that maximum: a length v
    shows up at least once with probability 1 - (1 - P(max = v))^micro_steps.
    """
    if micro_steps <= 0 or lengths.size == 0:
        return 0.0
    _, pmf = _max_pmf(lengths, batch)
    return float(np.sum(1.0 - (1.0 - np.clip(pmf, 0.0, 1.0)) ** micro_steps))


def clipped_lengths(lengths: Sequence[int], max_length: int) -> np.ndarray:
    return np.minimum(np.asarray(lengths, dtype=np.int64), max_length)


def expected_padded_tokens(lengths: Sequence[int], micro_batch_size: int, max_length: int) -> float:
    """Expected padded tokens of one micro-batch under dynamic padding.

    Each micro-batch is padded to its longest sample, so the answer is
    micro_batch_size x E[max length of micro_batch_size samples], exact for the empirical
    distribution (no simulation).
    """
    clipped = clipped_lengths(lengths, max_length)
    batch = min(micro_batch_size, clipped.size)
    return batch * _max_moments(clipped, batch)[0]


def epoch_averages(lengths: np.ndarray, samples: int, batch: int) -> tuple[float, float]:
    """Mean padded tokens and mean b*s^2 per micro-batch over a pass of `samples` samples."""
    full, rest = divmod(samples, batch)
    tokens = square = 0.0
    for size, count in ((batch, full), (rest, 1 if rest else 0)):
        if count:
            m1, m2 = _max_moments(lengths, size)
            tokens += count * size * m1
            square += count * size * m2
    n_batches = full + (1 if rest else 0)
    return tokens / max(n_batches, 1), square / max(n_batches, 1)


# transformers' LengthGroupedSampler (`get_length_grouped_indices`): a shuffled epoch is cut
# into mega-batches of up to 50 optimizer steps' samples, each sorted longest first.
MEGA_BATCH_MULT = 50


def grouped_padded_lengths(
    lengths: np.ndarray, micro_batch_size: int, accumulation: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Padded length and size of each micro-batch of one epoch grouped by length.

    The order transformers' `LengthGroupedSampler` makes (`train_sampling_strategy=
    "group_by_length"`), which the trainer builds with one optimizer step's samples of all
    GPUs (micro-batch x `accumulation`, which counts every GPU's) as its batch: shuffle, cut
    into mega-batches, sort each longest first, move the longest sample of all to the front.
    Redone here in numpy (this module must import without torch) on one seeded shuffle: the
    expected padding of a sorted mega-batch hardly depends on which shuffle it came from.
    Only the lengths are sorted, not their indices: a study's feasibility walk predicts many
    configurations over data of up to millions of samples.
    """
    n = int(lengths.size)
    batch = max(micro_batch_size, 1)
    group = batch * max(accumulation, 1)
    mult = max(min(n // (group * 4), MEGA_BATCH_MULT), 1)
    mega = mult * group
    shuffled = lengths[np.random.default_rng(seed).permutation(n)]
    whole = n // mega * mega
    flat = np.concatenate(
        (-np.sort(-shuffled[:whole].reshape(-1, mega), axis=1).ravel(), -np.sort(-shuffled[whole:]))
    )
    firsts = np.arange(0, n, mega)
    longest = firsts[int(np.argmax(flat[firsts]))]
    flat[0], flat[longest] = flat[longest], flat[0]
    starts = np.arange(0, n, batch)
    return (
        np.maximum.reduceat(flat, starts).astype(np.float64),
        np.diff(np.append(starts, n)).astype(np.float64),
    )


def grouped_averages(
    lengths: np.ndarray, micro_batch_size: int, accumulation: int
) -> tuple[float, float, np.ndarray]:
    """Mean padded tokens and mean b*s^2 per micro-batch over an epoch grouped by length,
    and each micro-batch's padded length (the shapes a run meets)."""
    padded, sizes = grouped_padded_lengths(lengths, micro_batch_size, accumulation)
    return (*padded_moments(padded, sizes), padded)


def padded_moments(padded: np.ndarray, sizes: np.ndarray) -> tuple[float, float]:
    """Mean padded tokens and mean b*s^2 per micro-batch of these padded lengths and sizes."""
    return float((sizes * padded).mean()), float((sizes * padded**2).mean())


def packed_averages(
    lengths: np.ndarray, max_length: int, batch: int, fused: bool
) -> tuple[int, float, float, np.ndarray]:
    """Packed sequences, mean tokens and mean attention term per micro-batch of `batch` of them,
    and the tokens of each micro-batch's row (its padded length: what a new shape is).

    A packed micro-batch is one row of real tokens only. A varlen (flash) kernel works on each
    sample's block (sum of squared sample lengths); eager and SDPA attention with the
    block-diagonal mask compute the whole row's scores and mask them (row length squared).
    `fused`: the former (`trainers.model.runtime.per_sample_attention` says which the
    trainer runs).
    """
    sequences = pack_lengths(lengths.tolist(), max_length)
    members = np.fromiter((i for group in sequences for i in group), dtype=np.int64)
    owner = np.repeat(np.arange(len(sequences)), [len(group) for group in sequences])
    per_sequence_tokens = np.bincount(owner, weights=lengths[members].astype(np.float64))
    rows = np.add.reduceat(per_sequence_tokens, np.arange(0, len(sequences), max(batch, 1)))
    tokens = float(lengths.sum()) / len(sequences) * batch
    if fused:
        per_sequence = float((lengths.astype(np.float64) ** 2).sum()) / len(sequences)
        return len(sequences), tokens, per_sequence * batch, rows
    return len(sequences), tokens, tokens**2, rows


def frozen_flops(total_parameters: float, tokens: float, gradient_checkpointing: bool) -> float:
    """Matmul FLOPs of the frozen weights in one micro-step over `tokens` padded tokens.

    Frozen weights need no weight gradients: forward 2N + input-gradient 2N = 4N per token
    (2/3 of the 6N rule); checkpointing re-runs the forward (+2N).
    """
    return (6.0 if gradient_checkpointing else 4.0) * total_parameters * tokens


def adapter_flops(
    trainable_parameters: float, tokens: float, gradient_checkpointing: bool
) -> float:
    """Matmul FLOPs of the LoRA adapters (trained fully: 6P per token, +2P recomputed)."""
    return (8.0 if gradient_checkpointing else 6.0) * trainable_parameters * tokens


def attention_flops(
    model: ModelSize, batch_seq_squared: float, gradient_checkpointing: bool
) -> float:
    """Attention score FLOPs (QK^T and AV, 4*h*s^2 per layer forward, x3 with backward)."""
    factor = 16.0 if gradient_checkpointing else 12.0
    return factor * model.n_layers * model.hidden_size * batch_seq_squared


def activation_bytes(
    model: ModelSize,
    micro_batch_size: int,
    seq_len: int,
    precision: str,
    gradient_checkpointing: bool,
    device_kind: str = "cpu",
    fused_loss: bool = False,
) -> float:
    """Activation + logits memory of one micro-batch.

    About 34 bytes per token x hidden per layer at 16 bit (Korthikanti et al. 2022,
    "Reducing Activation Recomputation in Large Transformer Models"), plus attention scores
    of about h/64 heads; fused (flash) attention, used on CUDA at half precision, stores no
    scores. `fused_loss`: the loss is computed from the hidden states in chunks (Liger's
    fused linear cross-entropy), so the logits and their gradient are never stored whole.
    """
    width = PRECISION_BYTES[precision]
    tokens = micro_batch_size * seq_len
    fused = device_kind == "cuda" and precision != "fp32"
    heads = max(model.hidden_size / 64.0, 1.0)
    scores = 0.0 if fused else 2.5 * heads * micro_batch_size * seq_len**2
    per_layer = 17.0 * tokens * model.hidden_size + scores
    if gradient_checkpointing:
        # Only each layer's input is kept; one layer's activations exist during recompute.
        layers = model.n_layers * tokens * model.hidden_size + per_layer
    else:
        layers = model.n_layers * per_layer
    logits = 0.0 if fused_loss else 2.0 * 4.0 * tokens * model.vocab_size  # fp32, + gradient
    return layers * width + logits


# Bytes per trainable (LoRA) parameter: fp32 adapter, its fp32 gradient, AdamW's two moments.
TRAINABLE_BYTES = {"lora_parameters": 4.0, "lora_gradients": 4.0, "optimizer_state": 8.0}


# NF4 with double quantization (Dettmers et al. 2023): 4 bits per weight, one 8-bit constant per
# block of 64 weights, one fp32 constant per 256 blocks: 4.127 bits.
NF4_BYTES_PER_WEIGHT = (4.0 + 8.0 / 64.0 + 32.0 / (64.0 * 256.0)) / 8.0
# Micro-steps of a 4-bit base are slower: each weight is de-quantized for the forward pass and
# again for the input gradient. Prior: QLoRA's runs took 1.39x the LoRA run's time (Raschka,
# "Practical Tips for Finetuning LLMs Using LoRA", 2023, 7B on an A100), with a band until
# trials measure it (x1.15 to x1.8 at p10/p90).
NF4_STEP_FACTOR = 1.39
NF4_LOG_P90 = math.log(1.8 / NF4_STEP_FACTOR)
NF4_LOG_P10 = math.log(1.15 / NF4_STEP_FACTOR)
# Micro-step time of a run with a speed lever (`trainers.model.levers`) over the same run
# without it. 1.0 until a GPU lease measures the lever (benchmarks/gpu_lease.py, part levers):
# no lever is on by default before that, and a run that turns one on is planned as without.
LEVER_STEP_FACTOR = {"liger": 1.0, "sdpa_fast_path": 1.0}


def weight_bytes(model: ModelSize, precision: str, quantization: str = "none") -> float:
    """Bytes of the base weights: at the training precision, or NF4 for the linear layers.

    bitsandbytes quantizes the linear layers only; PEFT's `prepare_model_for_kbit_training`
    then casts every parameter left unquantized to fp32, whatever the training precision:
    the input embedding and the output head (vocab x hidden each, counted untied: an upper
    bound) and the norms (two per layer and a final one, hidden each).
    """
    width = PRECISION_BYTES[precision]
    if quantization != "nf4":
        return float(model.total_parameters * width)
    norms = (2.0 * model.n_layers + 1.0) * model.hidden_size
    unquantized = min(2.0 * model.vocab_size * model.hidden_size + norms, model.total_parameters)
    return unquantized * PRECISION_BYTES["fp32"] + (
        model.total_parameters - unquantized
    ) * NF4_BYTES_PER_WEIGHT


def static_memory_bytes(
    model: ModelSize, trainable_parameters: float, precision: str, quantization: str = "none"
) -> float:
    """The base's weights (`weight_bytes`) + fp32 adapters, their gradients and AdamW's moments."""
    per_parameter = sum(TRAINABLE_BYTES.values())
    return weight_bytes(model, precision, quantization) + per_parameter * trainable_parameters
