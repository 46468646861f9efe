"""Where training records come from: JSONL read line by line, everything else through `datasets`.

`--data` takes a JSONL file (read here, so a malformed line is named by its line number), a
Parquet, CSV or JSON file (read by `datasets`; a bad record is named by its row number, the
first data row being row 1), or a folder written by `Dataset.save_to_disk` (a `DatasetDict`
folder gives its `train` split). `fingerprint` is what the token cache is keyed by: a file's
content hash, or the fingerprint `datasets` stored with a saved folder.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import BadInputError
from common.files import sha256_file
from trainers.data.paths import cache_root

if TYPE_CHECKING:
    from datasets import Dataset

# `datasets` builder per file suffix; `.jsonl` is read here (line numbers in errors).
BUILDERS = {".parquet": "parquet", ".csv": "csv", ".json": "json"}
SUFFIXES = (".jsonl", *BUILDERS)


class BadRecord(Exception):
    """A record that cannot be used; the message says why (without the location)."""


@dataclass(frozen=True)
class DataSource:
    """A checked `--data` path.

    Attributes:
        path: The file or folder.
        kind: ``"jsonl"``, ``"parquet"``, ``"csv"``, ``"json"`` or ``"saved"`` (a
            `save_to_disk` folder).
    """

    path: Path
    kind: str

    def location(self, number: int) -> str:
        """How an error names record `number` (1-based): ``path:line`` or ``path: row N``."""
        return f"{self.path}:{number}" if self.kind == "jsonl" else f"{self.path}: row {number}"


def open_source(path: str | Path) -> DataSource:
    """Check that `path` is data this project reads, before anything is written.

    Raises:
        BadInputError: Not found, an unsupported suffix, or a folder `save_to_disk` did not write.
    """
    path = Path(path)
    if path.is_dir():
        if not (path / "dataset_info.json").is_file() and not (
            path / "dataset_dict.json"
        ).is_file():
            raise BadInputError(
                f"data {path} is a directory but not one written by Dataset.save_to_disk "
                "(no dataset_info.json or dataset_dict.json): give a data file or such a folder"
            )
        return DataSource(path, "saved")
    if not path.is_file():
        raise BadInputError(f"data file not found: {path}")
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise BadInputError(
            f"data {path}: unsupported file type {path.suffix or '(none)'!r}; "
            f"give {', '.join(SUFFIXES)} or a Dataset.save_to_disk folder"
        )
    return DataSource(path, suffix.lstrip("."))


def fingerprint(source: DataSource) -> str:
    """What identifies the records: a file's sha256, a saved folder's `datasets` fingerprint."""
    if source.kind != "saved":
        return sha256_file(source.path)
    return f"datasets:{load_hf(source)._fingerprint}"


def records(source: DataSource) -> Iterator[tuple[int, Any]]:
    """(line or row number, record or a BadRecord) for every record of the source."""
    if source.kind == "jsonl":
        yield from _json_lines(source.path)
        return
    for number, row in enumerate(load_hf(source), start=1):
        yield number, _unset_keys_dropped(row)


def _unset_keys_dropped(row: dict[str, Any]) -> dict[str, Any]:
    """A row read through Arrow with the keys it never had taken out of its tools and tool calls.

    Arrow gives all the rows of a column one struct type: one record's `get_weather(city)`
    and another's `get_time(tz)` come back as `{"city": "Paris", "tz": None}` and
    `{"city": None, "tz": "UTC"}`, and tool schemas gain each other's properties. A chat
    template would render those nulls into the prompt and into the reply the model learns.
    In Arrow an unset key and a null are one thing, so every None key under `tools`,
    `chat_template_kwargs` and a message's fields other than role and content is dropped (a
    JSONL record keeps an explicit null: it was written).
    """
    out = dict(row)
    if isinstance(out.get("tools"), list):
        out["tools"] = _without_none_keys(out["tools"])
    if isinstance(out.get("chat_template_kwargs"), dict):  # a variable another row sets
        out["chat_template_kwargs"] = _without_none_keys(out["chat_template_kwargs"])
    for field in ("messages", "prompt", "completion"):  # the last two: conversational
        messages = out.get(field)
        if isinstance(messages, list):
            out[field] = [
                {
                    key: value if key in ("role", "content") else _without_none_keys(value)
                    for key, value in message.items()
                }
                if isinstance(message, dict)
                else message
                for message in messages
            ]
    return out


def _without_none_keys(value: Any) -> Any:
    """`value` with every dict's None-valued keys left out, at any depth (list items stay)."""
    if isinstance(value, dict):
        return {k: _without_none_keys(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none_keys(item) for item in value]
    return value


def load_hf(source: DataSource) -> Dataset:
    """The source as a `datasets.Dataset` (not for JSONL, which is read line by line).

    Raises:
        BadInputError: The file or folder cannot be read (the reader's reason, one line).
    """
    import datasets
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    try:
        if source.kind == "saved":
            loaded = datasets.load_from_disk(str(source.path))
            if isinstance(loaded, datasets.DatasetDict):
                if "train" not in loaded:
                    raise BadInputError(
                        f"data {source.path}: a DatasetDict without a 'train' split "
                        f"(it has {', '.join(loaded)})"
                    )
                loaded = loaded["train"]
        else:
            # A CSV cell is text: " 4" stays a completion, not the number 4.
            options: dict[str, Any] = {}
            if source.kind == "csv":
                options["features"] = datasets.Features(
                    {name: datasets.Value("string") for name in _csv_header(source.path)}
                )
            loaded = datasets.load_dataset(
                BUILDERS[f".{source.kind}"],
                data_files=str(source.path),
                split="train",
                cache_dir=str(cache_root() / "hf-datasets"),
                **options,
            )
    except BadInputError:
        raise
    except Exception as error:  # each reader (pyarrow, pandas, json) raises its own errors
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise BadInputError(f"data {source.path}: cannot be read as {source.kind}: {reason}") from None
    if not isinstance(loaded, datasets.Dataset):
        raise BadInputError(f"data {source.path}: expected a Dataset, got {type(loaded).__name__}")
    return loaded


def _csv_header(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8") as stream:
        return next(csv.reader(stream), [])


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON or a BadRecord) for every non-blank line."""
    with path.open("rb") as lines:
        for lineno, raw in enumerate(lines, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield lineno, BadRecord("not valid UTF-8")
                continue
            if not text.strip():
                continue
            try:
                yield lineno, json.loads(text)
            except json.JSONDecodeError as error:
                yield lineno, BadRecord(f"not valid JSON ({error.msg} at column {error.colno})")
