"""What a plan is made of before any download: a model's `config.json`, the data's token lengths.

`python -m analysis.plan` and the published-run priors read a model's configuration (a file,
a folder, or one shipped with the package) and the training samples' token lengths (counted
from a data set, or given as a number of samples of one length).
"""

from __future__ import annotations

import json
import math
import warnings
from importlib import resources
from pathlib import Path
from typing import Any

from common.errors import BadInputError

CHARS_PER_TOKEN = 4.0  # English text under a BPE tokenizer, when no tokenizer is given
VALIDATION_FRACTION = 0.1  # as a study holds out by default


def shipped_configs() -> dict[str, Path]:
    """The published model configurations shipped with the package, by file stem."""
    folder = Path(str(resources.files("analysis.planning").joinpath("model_configs")))
    return {path.stem: path for path in sorted(folder.glob("*.json"))}


def load_model_config(path: str | Path) -> Any:
    """Read a causal LM's `config.json` (or the folder holding one) without any weights.

    Raises:
        BadInputError: Missing, not JSON, or not a configuration transformers knows; one line.
    """
    from transformers import AutoConfig

    source = Path(path)
    if source.is_dir():
        source = source / "config.json"
    if not source.is_file():
        raise BadInputError(f"--model-config: no such file: {path}")
    try:
        raw = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(f"--model-config: {source} is not JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise BadInputError(f"--model-config: {source} has no model_type (not a config.json)")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if raw["model_type"] not in CONFIG_MAPPING:
        raise BadInputError(
            f"--model-config: {source}: model_type {raw['model_type']!r} is not one this "
            "transformers knows"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return AutoConfig.for_model(**raw)
        except (ValueError, KeyError, TypeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BadInputError(f"--model-config: {source}: {first}") from None


# ----------------------------------------------------------------------------- data


def lengths_from_count(samples: int, tokens_per_sample: int) -> tuple[int, ...]:
    """Train token lengths of `samples` samples of `tokens_per_sample` tokens each."""
    if samples < 2:
        raise BadInputError(f"--samples must be >= 2, but got {samples}")
    if tokens_per_sample < 1:
        raise BadInputError(f"--tokens-per-sample must be >= 1, but got {tokens_per_sample}")
    n_validation = max(1, round(samples * VALIDATION_FRACTION))
    return (tokens_per_sample,) * (samples - n_validation)


def lengths_from_data(
    data: str,
    *,
    max_length: int,
    tokenizer_dir: str | None,
    cache_dir: str | None = None,
    columns: str | None = None,
    split: str | None = None,
) -> tuple[tuple[int, ...], str]:
    """Train token lengths of a data set (see `trainers.data.sources`), and how they were measured.

    With a tokenizer folder the file goes through the trainer's own tokenization (exact);
    without one, each record's characters / `CHARS_PER_TOKEN` stand for its tokens.
    `columns` reads other columns as hpo's fields (`trainers.data.sources.parse_columns`).
    `split`: the data's split that validates (`validation_split`): the whole train split
    trains; else a share of it is held out, as the trainer holds it out.
    """
    from trainers.data.dataset import DataSpec, load_tokenized, split_indices

    if tokenizer_dir:
        from trainers.model.lora import load_tokenizer

        spec = DataSpec(
            path=data, max_length=max_length, cache_dir=cache_dir, data_columns=columns,
            validation_split=split,
        )  # fmt: skip
        loaded = load_tokenized(spec, load_tokenizer(tokenizer_dir))
        return tuple(loaded.stats.lengths[: len(loaded.train)]), f"tokenized ({tokenizer_dir})"
    chars = _record_characters(Path(data), columns, split)
    train = range(len(chars)) if split else split_indices(len(chars), VALIDATION_FRACTION, 0)[0]
    lengths = tuple(max(1, math.ceil(chars[i] / CHARS_PER_TOKEN)) for i in train)
    return lengths, f"estimated at {CHARS_PER_TOKEN:g} characters per token (no --tokenizer)"


def _record_characters(
    path: Path, columns: str | None = None, split: str | None = None
) -> list[int]:
    """Characters of text in each record of a data set, in any format and shape it can have
    (its train split; `split`: checked to be one of its splits)."""
    from trainers.data.records import read_native
    from trainers.data.sources import load_hf, open_source, with_columns, with_split

    try:
        source = with_columns(open_source(path), columns)
        if split:
            load_hf(with_split(source, split))  # a split the data lacks stops here
        _, records, _ = read_native(source)
    except BadInputError as error:
        raise BadInputError(f"--data: {error}") from None
    counts = []
    for record in records:
        texts = [record.get("text"), record.get("prompt"), record.get("completion")]
        for field in ("messages", "prompt", "completion"):  # the last two when conversational
            if isinstance(record.get(field), list):
                texts += [m["content"] for m in record[field]]
        counts.append(sum(len(t) for t in texts if isinstance(t, str)))
    if len(counts) < 2:
        raise BadInputError(f"--data: {path} has {len(counts)} record(s); a run needs 2")
    return counts
