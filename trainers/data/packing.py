"""Padding-free packing: several samples per training sequence, attention kept inside each.

Chat and instruction samples are mostly much shorter than ``max_length``; padded to the
longest sample of its micro-batch, most of a batch can be padding. With
``packing="padding_free"`` the training samples are first put into *packed sequences* of at
most ``max_length`` tokens (best-fit decreasing, deterministic), and ``micro_batch_size``
counts packed sequences. A micro-batch is then flattened into one row without any padding,
with position ids restarting at 0 for every sample (transformers'
``DataCollatorWithFlattening``). With no attention mask, transformers' mask builders
(``masking_utils.find_packed_sequence_indices``) turn the restarts into a block-diagonal
causal mask for eager and SDPA attention, and flash attention reads the same boundaries, so
no token attends across a sample boundary. That needs ``use_cache=False``: with a key/value
cache the restarts are not looked for, so the collator passes it with every batch.

Each sample keeps its own loss mask; the collator only masks the label of each sample's
first token, which the model's label shift never scores anyway (it would otherwise be
predicted from the previous sample's last token). Validation is never packed: every run of a
study is scored on the same padded validation batches.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainers.data.dataset import Example


@dataclass(frozen=True)
class PackedSequence:
    """Samples trained as one sequence (position ids restart at each)."""

    examples: tuple[Example, ...]

    @property
    def tokens(self) -> int:
        return sum(len(e.input_ids) for e in self.examples)


def pack_lengths(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    """Group sample indices into sequences of at most ``max_length`` tokens.

    Best-fit decreasing: longest sample first, each into the fullest sequence that still has
    room (a sorted list of free space, so O(n log n)); deterministic, and within 11/9 of the
    fewest sequences possible. A sample longer than ``max_length`` gets a sequence of
    its own (the data loader truncates before this).

    Args:
        lengths: Tokens of each sample.
        max_length: Most tokens of a packed sequence.

    Returns:
        The sample indices of each sequence, in order of creation.
    """
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, but got {max_length=}")
    return [list(group) for group in _packed(tuple(int(n) for n in lengths), max_length)]


@functools.lru_cache(maxsize=16)
def _packed(lengths: tuple[int, ...], max_length: int) -> tuple[tuple[int, ...], ...]:
    # Once per (lengths, max_length): the time model packs the same training lengths for
    # every configuration it judges and twice per trial, a Python loop over every sample.
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free tokens, sequence index), sorted
    for index in order:
        need = lengths[index]
        at = bisect.bisect_left(free, (need, -1))
        if at == len(free):  # no sequence has room: open one
            bins.append([index])
            left, which = max_length - need, len(bins) - 1
        else:
            left, which = free.pop(at)
            bins[which].append(index)
            left -= need
        if left > 0:
            bisect.insort(free, (left, which))
    return tuple(tuple(group) for group in bins)


def pack_examples(examples: Sequence[Example], max_length: int) -> list[PackedSequence]:
    """The training samples as packed sequences of at most ``max_length`` tokens."""
    groups = pack_lengths([len(e.input_ids) for e in examples], max_length)
    return [PackedSequence(tuple(examples[i] for i in sorted(group))) for group in groups]


def padding_share(lengths: Sequence[int], micro_batch_size: int) -> float:
    """Share of the token slots that are padding when consecutive samples are batched with
    dynamic padding (each micro-batch padded to its longest sample)."""
    slots = real = 0
    for first in range(0, len(lengths), micro_batch_size):
        batch = lengths[first : first + micro_batch_size]
        slots += max(batch) * len(batch)
        real += sum(batch)
    return 1.0 - real / slots if slots else 0.0


class PaddingFreeCollator:
    """A micro-batch of packed sequences -> one row without padding (per-sample positions).

    transformers' ``DataCollatorWithFlattening`` does the flattening; this adds
    ``use_cache=False`` (see the module docstring).
    """

    def __init__(self) -> None:
        from transformers import DataCollatorWithFlattening

        self.flatten = DataCollatorWithFlattening(return_tensors="pt")

    def __call__(self, batch: Sequence[PackedSequence | Example]) -> dict[str, Any]:
        samples = [
            example
            for item in batch
            for example in (item.examples if isinstance(item, PackedSequence) else (item,))
        ]
        features = [{"input_ids": e.input_ids, "labels": e.labels} for e in samples]
        out: dict[str, Any] = dict(self.flatten(features))
        out["use_cache"] = False
        return out


def samples_in(inputs: dict[str, Any]) -> int:
    """Samples in a collated micro-batch: rows, or position-id restarts in a packed one."""
    positions = inputs.get("position_ids")
    if positions is not None and inputs.get("attention_mask") is None:
        return int((positions == 0).sum())
    return int(inputs["input_ids"].shape[0])
