"""Training data: records -> validated, tokenized, cached examples and their statistics.

The data is a JSONL, Parquet, CSV or JSON file, a folder of them or a `Dataset.save_to_disk`
folder (see ``trainers.data.sources``). It holds one record shape (detected from its first good
record):

- ``{"text": ...}``: causal LM on the whole text, followed by eos.
- ``{"prompt": ..., "completion": ...}``: loss on the completion (and eos) only.
- ``{"messages": [{"role": ..., "content": ...}, ...]}``: chat; loss on assistant turns only,
  rendered with the tokenizer's chat template or a simple fallback (see ``trainers.data.records``).
- Alpaca (``instruction``/``input``/``output``) and ShareGPT (``conversations``): mapped to
  ``messages``.

The validation samples are a seeded share of the records (``validation_fraction``), or a
folder's or saved `DatasetDict`'s own split (``validation_split``: a Hub dataset's
`validation` or `test`). Samples longer than ``max_length`` are truncated, or with
``overflow="pack"`` concatenated (train and validation separately) and cut into
``max_length`` blocks. The tokenized records are
cached (see ``trainers.data.token_cache``), so a second load skips parsing and tokenizing.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.errors import BadInputError
from trainers.data import token_cache
from trainers.data.paths import cache_root, demo_data_path
from trainers.data.records import IGNORE_INDEX, read_pieces, tokenize_pieces
from trainers.data.sources import (
    DataSource,
    fingerprint,
    open_source,
    parse_columns,
    say_unread_splits,
    splits_read,
    with_columns,
    with_split,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "IGNORE_INDEX",
    "DataSpec",
    "DatasetStats",
    "Example",
    "TokenizedData",
    "demo_data_path",
    "load_tokenized",
]

OVERFLOW_MODES = ("truncate", "pack")


@dataclass(frozen=True)
class DataSpec:
    """What to load and how to cut it.

    Attributes:
        path: A JSONL, Parquet, CSV or JSON file, a folder of them, or a
            `Dataset.save_to_disk` folder.
        max_length: Longest sample in tokens.
        overflow: ``"truncate"`` cuts long samples; ``"pack"`` concatenates all samples and cuts
            the stream into ``max_length`` blocks.
        skip_bad_lines: Skip (and count) malformed lines instead of failing on the first one.
        validation_fraction: Share of the samples held out for validation (at least one).
        validation_split: A split of a data folder or saved `DatasetDict` to validate on
            instead (all of the train split trains); None: the share.
        data_columns: The data's columns read as hpo's fields ("output=response,...";
            `trainers.data.sources.parse_columns`), or None.
        seed: Seed of the train/validation split.
        cache_dir: Folder of the tokenized cache; ``None`` means ``<cache root>/tokenized``
            (cache root: ``$HPO_CACHE_DIR`` or ``~/.cache/hpo``).
    """

    path: str
    max_length: int = 128
    overflow: str = "truncate"
    skip_bad_lines: bool = False
    validation_fraction: float = 0.1
    validation_split: str | None = None
    data_columns: str | None = None
    seed: int = 0
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise BadInputError(f"data.path must be a non-empty string, but got path={self.path!r}")
        if not _is_int(self.max_length) or self.max_length < 2:
            raise BadInputError(
                f"data.max_length must be an integer >= 2, but got max_length={self.max_length!r}"
            )
        if self.overflow not in OVERFLOW_MODES:
            raise BadInputError(
                f"data.overflow must be 'truncate' or 'pack', but got overflow={self.overflow!r}"
            )
        if not isinstance(self.skip_bad_lines, bool):
            raise BadInputError(
                f"data.skip_bad_lines must be true or false, "
                f"but got skip_bad_lines={self.skip_bad_lines!r}"
            )
        fraction = self.validation_fraction
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, int | float)
            or not 0 < fraction < 1
        ):
            raise BadInputError(
                f"data.validation_fraction must be between 0 and 1 (exclusive), "
                f"but got validation_fraction={fraction!r}"
            )
        split = self.validation_split
        if split is not None and (not isinstance(split, str) or not split or split == "train"):
            raise BadInputError(
                "data.validation_split must name a split other than 'train' (or be unset), "
                f"but got validation_split={split!r}"
            )
        parse_columns(self.data_columns)
        if not _is_int(self.seed):
            raise BadInputError(f"data.seed must be an integer, but got seed={self.seed!r}")


@dataclass
class Example:
    """One training sample; ``labels`` is ``IGNORE_INDEX`` (-100) where a token carries no loss."""

    input_ids: list[int]
    labels: list[int]


@dataclass
class DatasetStats:
    """Size and token-length distribution of a loaded data set (train and validation)."""

    shape: str
    samples: int
    total_tokens: int
    tokens_mean: float
    tokens_p50: float
    tokens_p95: float
    tokens_max: int
    truncated: int
    skipped_lines: int
    lengths: list[int]
    records: int = 0  # usable records read (``samples`` counts blocks when packed)
    validation_records: int = 0  # of them, the data's own validation split's (0: a share)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of every field."""
        return asdict(self)


@dataclass
class TokenizedData:
    """Result of ``load_tokenized``."""

    train: list[Example]
    validation: list[Example]
    stats: DatasetStats
    cache_hit: bool
    cache_path: str


def load_tokenized(spec: DataSpec, tokenizer: PreTrainedTokenizerBase) -> TokenizedData:
    """Load, validate, tokenize (or take from the cache), split and measure a data set.

    Args:
        spec: What to load.
        tokenizer: The model's tokenizer; needs an eos token.

    Returns:
        Train and validation examples, statistics and where the cache lies.

    Raises:
        BadInputError: Missing or unreadable data, malformed record (``path:line: what`` or
            ``path: row N: what``), empty data set, fewer than two samples, or a tokenizer
            without an eos token.
    """
    source = with_columns(open_source(spec.path), spec.data_columns)
    path = source.path
    held = with_split(source, spec.validation_split) if spec.validation_split else None
    if tokenizer.eos_token_id is None:
        raise BadInputError(f"tokenizer {type(tokenizer).__name__} has no eos token")
    data_fingerprint = fingerprint(source)
    if held is not None:  # the split's name and, for a saved DatasetDict, its own records
        data_fingerprint += f"|{held.split}:{fingerprint(held)}"
    if source.columns:  # other columns read: other records
        data_fingerprint += f"|columns:{source.columns}"
    key = token_cache.cache_key(
        data_fingerprint=data_fingerprint, tokenizer=tokenizer, skip_bad_lines=spec.skip_bad_lines
    )
    cache_dir = Path(spec.cache_dir) if spec.cache_dir is not None else cache_root() / "tokenized"
    # Two levels: the samples whole (`key`), which every length is cut from, and, when cut,
    # each length's own file, so a trial reads no more than it trains on.
    whole_file = cache_dir / f"{key}.npz"
    cut = spec.overflow == "truncate"
    cache_file = cache_dir / f"{key}-{spec.max_length}.npz" if cut else whole_file
    cached = token_cache.load(cache_file)
    if cached is None and cut:
        cached = token_cache.load(whole_file)  # another length's tokenization, cut below
    if cached is not None:
        shape, samples, meta = cached
        skipped, held_from = int(meta["skipped_lines"]), meta.get("validation_from")
    else:
        shape, pieces, skipped = read_pieces(source, tokenizer, skip_bad_lines=spec.skip_bad_lines)
        held_from = None
        if held is not None:
            pieces, skipped, held_from = _with_held_split(
                shape, pieces, skipped, held, tokenizer, spec
            )
        samples = tokenize_pieces(pieces, tokenizer)
        # The folder's splits, read now: a cache hit reads no data and must still say them.
        meta = {
            "skipped_lines": skipped,
            "validation_from": held_from,
            "splits": splits_read(source),
        }
        token_cache.save(whole_file, shape, samples, meta)
    hit = cached is not None  # nothing rendered nor tokenized
    truncated = int(meta.get("truncated", 0))
    if cut and "truncated" not in meta:  # cut from the whole samples: this length's file
        truncated = sum(len(ids) > spec.max_length for ids, _ in samples)
        if truncated:
            samples = [(ids[: spec.max_length], lab[: spec.max_length]) for ids, lab in samples]
            token_cache.save(cache_file, shape, samples, {**meta, "truncated": truncated})
        else:  # nothing longer: the whole file is this length's too
            cache_file = whole_file
    if source.kind in ("folder", "saved"):
        say_unread_splits(source, ["train", *([held.split] if held else [])], meta.get("splits"))
    if len(samples) < 2:
        raise BadInputError(
            f"{path}: {len(samples)} usable sample(s); need at least 2 to hold out validation"
        )
    if held_from is not None:  # the held split's samples follow the train split's
        train_idx, val_idx = list(range(held_from)), list(range(held_from, len(samples)))
    else:
        train_idx, val_idx = split_indices(len(samples), spec.validation_fraction, spec.seed)
    train = [Example(list(samples[i][0]), list(samples[i][1])) for i in train_idx]
    validation = [Example(list(samples[i][0]), list(samples[i][1])) for i in val_idx]
    if spec.overflow == "pack":
        train, validation = pack(train, spec.max_length), pack(validation, spec.max_length)
    stats = compute_stats(shape, train + validation, truncated=truncated, skipped_lines=skipped)
    stats.records = len(samples)
    stats.validation_records = len(samples) - held_from if held_from is not None else 0
    return TokenizedData(train, validation, stats, hit, str(cache_file))


def _with_held_split(
    shape: str,
    pieces: list[Any],
    skipped: int,
    held: DataSource,
    tokenizer: PreTrainedTokenizerBase,
    spec: DataSpec,
) -> tuple[list[Any], int, int]:
    """The train split's pieces followed by the held split's, the bad records of both, and
    where the held split's begin.

    Raises:
        BadInputError: The held split is of another record shape than the train split.
    """
    held_shape, held_pieces, held_skipped = read_pieces(
        held, tokenizer, skip_bad_lines=spec.skip_bad_lines
    )
    if held_shape != shape:
        raise BadInputError(
            f"data {held.path}: its {held.split} split holds {held_shape} records, its train "
            f"split {shape} records (one shape for both)"
        )
    return [*pieces, *held_pieces], skipped + held_skipped, len(pieces)


def long_tail_length(lengths: Sequence[int], context: int) -> int:
    """The data's p99 token length (rounded up to a multiple of 8), within `context`.

    A study trains and validates at it unless told otherwise: only the data's rare longest
    1 % of samples is cut, and every run of the study sees the same tokens.
    """
    if not lengths:
        return context
    p99 = int(np.ceil(float(np.percentile(np.asarray(lengths), 99))))
    return int(min(context, max(8, -(-p99 // 8) * 8)))


def validation_count(count: int, validation_fraction: float) -> int:
    """Samples of ``count`` held out for validation: the share, at least one, leaving one."""
    return min(max(1, round(count * validation_fraction)), count - 1)


def split_indices(count: int, validation_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic train/validation split of ``count`` samples (each side keeps file order).

    Returns:
        Train indices and validation indices; validation has at least one, train too.
    """
    order = list(range(count))
    random.Random(seed).shuffle(order)
    n_validation = validation_count(count, validation_fraction)
    return sorted(order[n_validation:]), sorted(order[:n_validation])


def pack(examples: Sequence[Example], max_length: int) -> list[Example]:
    """Concatenate examples and cut the stream into ``max_length`` blocks (the last may be short).

    Attention is not masked at sample boundaries (plain packing, as in causal LM pretraining).
    """
    ids = [token for example in examples for token in example.input_ids]
    labels = [label for example in examples for label in example.labels]
    return [
        Example(ids[start : start + max_length], labels[start : start + max_length])
        for start in range(0, len(ids), max_length)
    ]


def compute_stats(
    shape: str, examples: Sequence[Example], *, truncated: int, skipped_lines: int
) -> DatasetStats:
    """Statistics of the final samples (after truncation or packing)."""
    lengths = [len(example.input_ids) for example in examples]
    array = np.asarray(lengths, dtype=np.float64)
    return DatasetStats(
        shape=shape,
        samples=len(lengths),
        total_tokens=int(array.sum()),
        tokens_mean=float(array.mean()),
        tokens_p50=float(np.percentile(array, 50)),
        tokens_p95=float(np.percentile(array, 95)),
        tokens_max=int(array.max()),
        truncated=truncated,
        skipped_lines=skipped_lines,
        lengths=lengths,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
