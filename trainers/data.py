"""Training data: JSONL records -> validated, tokenized, cached examples and their statistics.

A file holds one of three record shapes (detected from its first good record):

- ``{"text": ...}``: causal LM on the whole text, followed by eos.
- ``{"prompt": ..., "completion": ...}``: loss on the completion (and eos) only.
- ``{"messages": [{"role": ..., "content": ...}, ...]}``: chat; loss on assistant turns only.
  With ``tokenizer.chat_template`` set, the conversation is rendered by the template and each
  assistant turn is what rendering one more message adds after the generation prompt. Without
  a template every message becomes ``<|{role}|>\n{content}\n`` with eos right after an
  assistant's content; only that content and its eos carry loss.

Samples longer than ``max_length`` are truncated, or with ``overflow="pack"`` concatenated
(train and validation separately) and cut into ``max_length`` blocks. The tokenized records are
cached (see ``trainers.token_cache``), so a second load skips parsing and tokenizing.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainers import token_cache
from trainers.errors import BadInputError
from trainers.paths import cache_root, demo_data_path

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "DataSpec",
    "DatasetStats",
    "Example",
    "TokenizedData",
    "demo_data_path",
    "load_tokenized",
]

SHAPES = ("text", "prompt_completion", "messages")
ROLES = ("system", "user", "assistant")
OVERFLOW_MODES = ("truncate", "pack")
IGNORE_INDEX = -100

# A piece of a rendered sample: text to tokenize (or token ids as they are) and whether its
# tokens carry loss.
Piece = tuple[str | list[int], bool]


@dataclass(frozen=True)
class DataSpec:
    """What to load and how to cut it.

    Attributes:
        path: JSONL file, one record per line.
        max_length: Longest sample in tokens.
        overflow: ``"truncate"`` cuts long samples; ``"pack"`` concatenates all samples and cuts
            the stream into ``max_length`` blocks.
        skip_bad_lines: Skip (and count) malformed lines instead of failing on the first one.
        validation_fraction: Share of the samples held out for validation (at least one).
        seed: Seed of the train/validation split.
        cache_dir: Folder of the tokenized cache; ``None`` means ``<cache root>/tokenized``
            (cache root: ``$HPO_CACHE_DIR`` or ``~/.cache/hpo``).
    """

    path: str
    max_length: int = 128
    overflow: str = "truncate"
    skip_bad_lines: bool = False
    validation_fraction: float = 0.1
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


class _BadLine(Exception):
    """A record that cannot be used; the message says why (without the location)."""


def load_tokenized(spec: DataSpec, tokenizer: PreTrainedTokenizerBase) -> TokenizedData:
    """Load, validate, tokenize (or take from the cache), split and measure a JSONL data set.

    Args:
        spec: What to load.
        tokenizer: The model's tokenizer; needs an eos token.

    Returns:
        Train and validation examples, statistics and where the cache lies.

    Raises:
        BadInputError: Missing file, malformed line (``path:line: what``), empty data set, fewer
            than two samples, or a tokenizer without an eos token.
    """
    path = Path(spec.path)
    if not path.is_file():
        raise BadInputError(f"data file not found: {path}")
    if tokenizer.eos_token_id is None:
        raise BadInputError(f"tokenizer {type(tokenizer).__name__} has no eos token")
    key = token_cache.cache_key(
        data_sha256=token_cache.file_sha256(path),
        tokenizer=tokenizer,
        max_length=spec.max_length,
        overflow=spec.overflow,
        skip_bad_lines=spec.skip_bad_lines,
    )
    cache_dir = Path(spec.cache_dir) if spec.cache_dir is not None else cache_root() / "tokenized"
    cache_file = cache_dir / f"{key}.npz"
    cached = token_cache.load(cache_file)
    if cached is not None:
        shape, samples, meta = cached
        skipped, truncated = int(meta["skipped_lines"]), int(meta["truncated"])
    else:
        shape, pieces, skipped = read_pieces(path, tokenizer, skip_bad_lines=spec.skip_bad_lines)
        samples = tokenize_pieces(pieces, tokenizer)
        truncated = 0
        if spec.overflow == "truncate":
            truncated = sum(len(ids) > spec.max_length for ids, _ in samples)
            samples = [(ids[: spec.max_length], lab[: spec.max_length]) for ids, lab in samples]
        token_cache.save(
            cache_file, shape, samples, {"skipped_lines": skipped, "truncated": truncated}
        )
    if len(samples) < 2:
        raise BadInputError(
            f"{path}: {len(samples)} usable sample(s); need at least 2 to hold out validation"
        )
    train_idx, val_idx = split_indices(len(samples), spec.validation_fraction, spec.seed)
    train = [Example(list(samples[i][0]), list(samples[i][1])) for i in train_idx]
    validation = [Example(list(samples[i][0]), list(samples[i][1])) for i in val_idx]
    if spec.overflow == "pack":
        train, validation = pack(train, spec.max_length), pack(validation, spec.max_length)
    stats = compute_stats(shape, train + validation, truncated=truncated, skipped_lines=skipped)
    return TokenizedData(train, validation, stats, cached is not None, str(cache_file))


def read_pieces(
    path: Path, tokenizer: PreTrainedTokenizerBase, *, skip_bad_lines: bool = False
) -> tuple[str, list[list[Piece]], int]:
    """Parse and validate a JSONL file and render every record into labelled pieces.

    Args:
        path: The JSONL file.
        tokenizer: Renders chat records (template, special tokens).
        skip_bad_lines: Count malformed lines instead of raising.

    Returns:
        The file's record shape, the pieces of each good record, and the number of skipped lines.

    Raises:
        BadInputError: ``path:line: what`` for a malformed line (unless skipped), or no good
            record at all.
    """
    shape: str | None = None
    rendered: list[list[Piece]] = []
    skipped = 0
    prefix = special_prefix(tokenizer)
    for lineno, record in _json_lines(path):
        try:
            if isinstance(record, _BadLine):
                raise record
            record_shape = _validate(record)
            if shape is not None and record_shape != shape:
                raise _BadLine(f"a {record_shape} record in a {shape} file (one shape per file)")
            rendered.append(_render(record_shape, record, tokenizer, prefix))
            shape = record_shape
        except _BadLine as bad:
            if not skip_bad_lines:
                raise BadInputError(f"{path}:{lineno}: {bad}") from None
            skipped += 1
    if shape is None:
        raise BadInputError(f"{path}: no usable records ({skipped} bad line(s) skipped)")
    return shape, rendered, skipped


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON or a _BadLine) for every non-blank line."""
    with path.open("rb") as lines:
        for lineno, raw in enumerate(lines, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield lineno, _BadLine("not valid UTF-8")
                continue
            if not text.strip():
                continue
            try:
                yield lineno, json.loads(text)
            except json.JSONDecodeError as error:
                yield lineno, _BadLine(f"not valid JSON ({error.msg} at column {error.colno})")


def _validate(record: Any) -> str:
    """Check one parsed record and return its shape; raises _BadLine."""
    if not isinstance(record, dict):
        raise _BadLine(f"expected a JSON object, got {_json_type(record)}")
    if "messages" in record:
        _validate_messages(record["messages"])
        return "messages"
    if "prompt" in record or "completion" in record:
        for field in ("prompt", "completion"):
            _require_str(record, field)
        return "prompt_completion"
    if "text" in record:
        if not _require_str(record, "text"):
            raise _BadLine("field 'text' is empty")
        return "text"
    raise _BadLine("no 'text', 'prompt'/'completion' or 'messages' field")


def _validate_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise _BadLine(f"field 'messages' must be a non-empty list, got {_json_type(messages)}")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _BadLine(f"{where} must be an object, got {_json_type(message)}")
        role = message.get("role")
        if role not in ROLES:
            raise _BadLine(
                f"{where} has unknown role {role!r} (expected system, user or assistant)"
            )
        if not isinstance(message.get("content"), str):
            got = _json_type(message.get("content")) if "content" in message else "nothing"
            raise _BadLine(f"{where}.content must be a string, got {got}")
    if messages[0]["role"] == "assistant":
        raise _BadLine("messages[0] is an assistant message; start with a system or user message")
    if not any(message["role"] == "assistant" for message in messages):
        raise _BadLine("no assistant message (nothing to learn from)")


def _require_str(record: dict[str, Any], field: str) -> str:
    if field not in record:
        raise _BadLine(f"missing field {field!r}")
    value = record[field]
    if not isinstance(value, str):
        raise _BadLine(f"field {field!r} must be a string, got {_json_type(value)}")
    return value


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _render(
    shape: str, record: dict[str, Any], tokenizer: PreTrainedTokenizerBase, prefix: list[int]
) -> list[Piece]:
    """Turn one valid record into labelled pieces."""
    eos: list[int] = [int(tokenizer.eos_token_id)]  # type: ignore[arg-type]
    if shape == "text":
        return [(prefix, False), (record["text"], True), (eos, True)]
    if shape == "prompt_completion":
        return [
            (prefix, False),
            (record["prompt"], False),
            (record["completion"], True),
            (eos, True),
        ]
    messages = [{"role": m["role"], "content": m["content"]} for m in record["messages"]]
    if tokenizer.chat_template:
        return _render_with_template(messages, tokenizer)
    pieces: list[Piece] = [(prefix, False)]
    for message in messages:
        is_assistant = message["role"] == "assistant"
        pieces.append((f"<|{message['role']}|>\n", False))
        pieces.append((message["content"], is_assistant))
        if is_assistant:
            pieces.append((eos, True))
        pieces.append(("\n", False))
    return pieces


def _render_with_template(
    messages: list[dict[str, str]], tokenizer: PreTrainedTokenizerBase
) -> list[Piece]:
    """Pieces of a conversation rendered by the tokenizer's chat template.

    An assistant turn's labelled text is what rendering it adds to the rendering of the messages
    before it with the generation prompt, so the template's end-of-turn marker carries loss too.
    """

    def render(part: list[dict[str, str]], generation_prompt: bool) -> str:
        try:
            text = tokenizer.apply_chat_template(
                part, tokenize=False, add_generation_prompt=generation_prompt
            )
        except Exception as error:  # jinja raises its own errors (e.g. role order rules)
            raise _BadLine(f"chat template failed: {error}") from None
        if not isinstance(text, str):
            raise _BadLine(f"chat template returned {type(text).__name__}, expected text")
        return text

    full = render(messages, False)
    pieces: list[Piece] = []
    cursor = 0
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(messages[:index], True)
        upto = render(messages[: index + 1], False)
        if len(before) < cursor or not (upto.startswith(before) and full.startswith(upto)):
            raise _BadLine(
                "the tokenizer's chat template does not render this conversation prefix by "
                "prefix, so its assistant turns cannot be located"
            )
        pieces.append((full[cursor : len(before)], False))
        pieces.append((full[len(before) : len(upto)], True))
        cursor = len(upto)
    pieces.append((full[cursor:], False))
    return pieces


def special_prefix(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids the tokenizer puts before a text on its own (e.g. Llama's bos), else []."""
    bare = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    full = list(tokenizer("a")["input_ids"])
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start]
    return []


def tokenize_pieces(
    samples: Sequence[Sequence[Piece]], tokenizer: PreTrainedTokenizerBase
) -> list[tuple[list[int], list[int]]]:
    """Tokenize rendered samples (one batched tokenizer call) into (input_ids, labels)."""
    texts = [part for pieces in samples for part, _ in pieces if isinstance(part, str)]
    encoded = iter(tokenizer(texts, add_special_tokens=False)["input_ids"]) if texts else iter([])
    result = []
    for pieces in samples:
        ids: list[int] = []
        labels: list[int] = []
        for part, labelled in pieces:
            part_ids = list(next(encoded)) if isinstance(part, str) else part
            ids.extend(part_ids)
            labels.extend(part_ids if labelled else [IGNORE_INDEX] * len(part_ids))
        result.append((ids, labels))
    return result


def split_indices(count: int, validation_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic train/validation split of ``count`` samples (each side keeps file order).

    Returns:
        Train indices and validation indices; validation has at least one, train too.
    """
    order = list(range(count))
    random.Random(seed).shuffle(order)
    n_validation = min(max(1, round(count * validation_fraction)), count - 1)
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
