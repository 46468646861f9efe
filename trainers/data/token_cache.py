"""On-disk cache of tokenized data sets: ``.npz`` files per (data, tokenizer) key.

`<key>.npz` holds the samples whole, as rendered and tokenized once: every `max_length` and
`overflow` a study's profiles use (and its validation length) is cut from it, and each cut
length is kept as `<key>-<max_length>.npz`, so a trial reads no more than it trains on
(`trainers.data.dataset.load_tokenized`).

The format is plain numpy arrays (no pickle): all input ids and labels concatenated, the
offsets where each sample starts, and a JSON string of metadata. Files are written to a temp
file and moved into place (`common.files.write_atomic`), so a reader sees a whole file or none.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.files import write_atomic

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

CACHE_FORMAT = 4
"""Bump when the tokenized content changes for the same inputs (rendering, labels, format).
2: a conversation its chat template does not render prefix by prefix (Mistral v0.3's with a
system message, Qwen3's with several replies) is rendered as at its last reply, and one whose
template refuses a system message (Gemma 1's) has it joined to the first user turn, where 1
skipped both under skip_bad_lines; a message's other fields (`reasoning_content`) reach the
template, where 1 dropped them; content given as text parts and tool messages are read,
where 1 skipped them. 3: a Parquet, JSON or saved-dataset record's tools and tool calls lose
the keys Arrow filled with None from other rows, which 2 rendered as nulls. 4: a record's
`chat_template_kwargs` reach the template, reasoning written into a reply's content trains
(DeepSeek-R1's, and Qwen3's earlier replies), and `tools` given as JSON text are read; the
samples are stored whole under a key without `max_length` and `overflow`, each cut length
beside them."""

Sample = tuple[list[int], list[int]]


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """What identifies a tokenizer's behaviour: class, size, vocab/rules hash, specials, template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        body = backend.to_str()  # vocab, merges, normalizer, pre-tokenizer, post-processor
    else:
        body = json.dumps(sorted(tokenizer.get_vocab().items()))
    return {
        "class": type(tokenizer).__name__,
        "vocab_size": len(tokenizer),
        "vocab_sha256": hashlib.sha256(body.encode("utf-8")).hexdigest(),
        "special_tokens": json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str),
        "extra_special_tokens": sorted(str(token) for token in tokenizer.all_special_tokens),
        "chat_template": json.dumps(tokenizer.chat_template, sort_keys=True, default=str),
    }


def cache_key(*, data_fingerprint: str, tokenizer: PreTrainedTokenizerBase, skip_bad_lines: bool) -> str:
    """sha256 hex key of everything the cached (uncut) samples depend on."""
    identity = {
        "format": CACHE_FORMAT,
        "data_sha256": data_fingerprint,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        # A file with bad lines loads under skip_bad_lines but must still fail without it.
        "skip_bad_lines": skip_bad_lines,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()


def save(path: Path, shape: str, samples: Sequence[Sample], meta: dict[str, Any]) -> bool:
    """Write samples atomically; a cache that cannot be written only costs a warning.

    Returns:
        Whether the file was written.
    """
    lengths = np.fromiter((len(ids) for ids, _ in samples), dtype=np.int64, count=len(samples))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    input_ids = np.fromiter((t for ids, _ in samples for t in ids), dtype=np.int64)
    labels = np.fromiter((t for _, lab in samples for t in lab), dtype=np.int64)
    header = np.array(json.dumps({"shape": shape, **meta}))
    try:
        write_atomic(
            path,
            lambda stream: np.savez(
                stream, input_ids=input_ids, labels=labels, offsets=offsets, meta=header
            ),
        )
        return True
    except OSError as error:
        logger.warning("could not write the tokenized cache %s: %s", path, error)
        return False


def load(path: Path) -> tuple[str, list[Sample], dict[str, Any]] | None:
    """Read a cache file; ``None`` if it is missing or unreadable (then it gets rebuilt).

    Returns:
        The record shape, the samples and the metadata saved with them.
    """
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as arrays:
            meta = json.loads(str(arrays["meta"]))
            input_ids = arrays["input_ids"].tolist()
            labels = arrays["labels"].tolist()
            offsets = arrays["offsets"].tolist()
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        logger.warning("ignoring unreadable tokenized cache %s: %s", path, error)
        return None
    samples = [
        (input_ids[start:end], labels[start:end])
        for start, end in zip(offsets[:-1], offsets[1:], strict=True)
    ]
    shape = meta.pop("shape")
    return shape, samples, meta
