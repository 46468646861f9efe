"""Where training records come from: JSONL read line by line, everything else through `datasets`.

`--data` takes a JSONL file (read here, so a malformed line is named by its line number), a
Parquet, CSV or JSON file (read by `datasets`; a bad record is named by its row number, the
first data row being row 1), a folder written by `Dataset.save_to_disk` (a `DatasetDict`
folder gives its `train` split) or a folder of data files, such as a dataset repository from
the Hugging Face Hub (`data/train-00000-of-00004.parquet`, ...): `datasets.load_dataset` reads
its `train` split as the Hub does, by file names or the README's `configs`, all shards in
order. `fingerprint` is what the token cache is keyed by: a file's content hash, the hash of
a folder's data files, or the fingerprint `datasets` stored with a saved folder.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import BadInputError
from common.files import sha256_file
from trainers.data.paths import cache_root

if TYPE_CHECKING:
    from datasets import Dataset

log = logging.getLogger(__name__)

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
        kind: ``"jsonl"``, ``"parquet"``, ``"csv"``, ``"json"``, ``"saved"`` (a
            `save_to_disk` folder) or ``"folder"`` (a folder of data files).
        split: The split read from a folder or a saved `DatasetDict` (`with_split`).
        columns: (hpo's field, the data's column) pairs each record is read through
            (`with_columns`).
    """

    path: Path
    kind: str
    split: str = "train"
    columns: tuple[tuple[str, str], ...] = ()

    def location(self, number: int) -> str:
        """How an error names record `number` (1-based): ``path:line``, ``path: row N`` (of
        a folder's split, its shards in order)."""
        if self.kind == "jsonl":
            return f"{self.path}:{number}"
        of_split = self.kind == "folder" or self.split != "train"
        return f"{self.path}: row {number}" + (f" of its {self.split} split" if of_split else "")


def with_split(source: DataSource, split: str) -> DataSource:
    """The source's `split`, for a folder or a saved `DatasetDict` (`load_hf` checks that it
    has one of that name).

    Raises:
        BadInputError: A single file, which has no splits.
    """
    if source.kind not in ("folder", "saved"):
        raise BadInputError(
            f"data {source.path} is one file, without splits: validation_split {split!r} "
            "names a split of a data folder (a Hub dataset's) or a saved DatasetDict"
        )
    return dataclasses.replace(source, split=split)


# The fields a record shape reads (`trainers.data.records`): what a column can be read as.
FIELDS = (
    "text", "prompt", "completion", "messages", "instruction", "input", "output", "system",
    "conversations", "tools", "chat_template_kwargs",
)  # fmt: skip


def parse_columns(text: str | None) -> tuple[tuple[str, str], ...]:
    """`data_columns` ("output=response,input=context": hpo's field = the data's column) as
    pairs.

    Raises:
        BadInputError: Not such pairs, a field no record shape reads, or one named twice.
    """
    if not text:
        return ()
    pairs = []
    for item in str(text).split(","):
        field, sep, column = (part.strip() for part in item.partition("="))
        if not sep or not field or not column:
            raise BadInputError(
                f"data_columns must be FIELD=COLUMN pairs joined by commas (output=response,"
                f"input=context), but got {text!r}"
            )
        if field not in FIELDS:
            raise BadInputError(
                f"data_columns: {field!r} is not a field hpo reads (one of {', '.join(FIELDS)})"
            )
        pairs.append((field, column))
    if len({field for field, _ in pairs}) < len(pairs):
        raise BadInputError(f"data_columns names a field twice: {text!r}")
    return tuple(pairs)


def with_columns(source: DataSource, text: str | None) -> DataSource:
    """The source read through `data_columns` (`parse_columns`)."""
    return dataclasses.replace(source, columns=parse_columns(text))


def open_source(path: str | Path) -> DataSource:
    """Check that `path` is data this project reads, before anything is written.

    Raises:
        BadInputError: Not found, an unsupported suffix, or a folder `save_to_disk` did not write.
    """
    path = Path(path)
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
            return DataSource(path, "saved")
        if not data_files(path):
            raise BadInputError(
                f"data {path} is a directory with no data files ({', '.join(SUFFIXES)}) and "
                "not one written by Dataset.save_to_disk (no dataset_info.json or "
                "dataset_dict.json)"
            )
        return DataSource(path, "folder")
    if not path.is_file():
        hint = ""
        if re.fullmatch(r"[\w.-]+/[\w.-]+", str(path)) and not path.suffix:
            # A Hub dataset's name: hpo reads no hub, but its downloaded folder.
            hint = (
                f" (a Hub dataset? hpo reads local data: `hf download --repo-type dataset "
                f"{path} --local-dir DIR`, then --data DIR)"
            )
        raise BadInputError(f"data file not found: {path}{hint}")
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise BadInputError(
            f"data {path}: unsupported file type {path.suffix or '(none)'!r}; "
            f"give {', '.join(SUFFIXES)} or a Dataset.save_to_disk folder"
        )
    return DataSource(path, suffix.lstrip("."))


def data_files(folder: Path) -> list[Path]:
    """The data files under `folder` (any depth, hidden folders such as `.cache` left out),
    sorted: what `datasets` may read from it."""
    return sorted(
        path for path in folder.rglob("*")
        if path.suffix.lower() in SUFFIXES and path.is_file()
        and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    )  # fmt: skip


def fingerprint(source: DataSource) -> str:
    """What identifies the records: a file's sha256, a saved folder's `datasets` fingerprint
    (of the source's split), a folder's data files (their names and contents, and its
    README, whose `configs` may choose among them)."""
    if source.kind == "saved":
        return f"datasets:{load_hf(source)._fingerprint}"
    if source.kind != "folder":
        return sha256_file(source.path)
    digest = hashlib.sha256()
    readme = source.path / "README.md"
    for path in [*data_files(source.path), *([readme] if readme.is_file() else [])]:
        digest.update(f"{path.relative_to(source.path).as_posix()}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def records(source: DataSource) -> Iterator[tuple[int, Any]]:
    """(line or row number, record or a BadRecord) for every record of the source, its
    columns renamed to hpo's fields (`DataSource.columns`)."""
    rows = (
        _json_lines(source.path) if source.kind == "jsonl" else enumerate(load_hf(source), start=1)
    )
    for number, row in rows:
        if source.columns and isinstance(row, dict):
            row = _renamed(row, source.columns)
        yield (
            number,
            row
            if source.kind == "jsonl" or not isinstance(row, dict)
            else _unset_keys_dropped(row),
        )


def _renamed(row: dict[str, Any], columns: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """The row with each named column as hpo's field (a column it lacks: the field unset, so
    the record's own check names what is missing); the field's own column, if any, gives way."""
    taken = {name for pair in columns for name in pair}
    out = {key: value for key, value in row.items() if key not in taken}
    out.update({field: row[column] for field, column in columns if column in row})
    return out


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
        if source.kind in ("saved", "folder"):
            loaded = (
                datasets.load_from_disk(str(source.path)) if source.kind == "saved"
                else datasets.load_dataset(
                    str(source.path), cache_dir=str(cache_root() / "hf-datasets"),
                    **_csv_features(source.path),
                )
            )  # fmt: skip
            if isinstance(loaded, datasets.DatasetDict):
                if source.split not in loaded:
                    raise BadInputError(
                        f"data {source.path}: {'a DatasetDict' if source.kind == 'saved' else 'a folder'} "
                        f"without a {source.split!r} split (it has {', '.join(loaded)})"
                    )
                _SPLITS[source.path] = list(loaded)
                loaded = loaded[source.split]
            elif source.split != "train":
                raise BadInputError(
                    f"data {source.path}: a saved Dataset, without splits: validation_split "
                    f"{source.split!r} names a split of a saved DatasetDict or a data folder"
                )
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
        raise BadInputError(
            f"data {source.path}: cannot be read as {source.kind}: {_reason(error)}"
        ) from None
    if not isinstance(loaded, datasets.Dataset):
        raise BadInputError(f"data {source.path}: expected a Dataset, got {type(loaded).__name__}")
    return loaded


def _reason(error: BaseException) -> str:
    """An error's first line, and its cause's where it wraps one (`datasets`' "An error
    occurred while generating the dataset" over pyarrow's "Couldn't cast ... because column
    names don't match", whose first and last lines say it)."""
    text = str(error).strip().splitlines()
    reason = text[0] if text else type(error).__name__
    cause = error.__cause__ or error.__context__
    if cause is not None and (lines := str(cause).strip().splitlines()):
        reason += f": {lines[0]}" + (f" ... {lines[-1]}" if len(lines) > 1 else "")
    return reason


# The splits of each folder or saved DatasetDict read in this process.
_SPLITS: dict[Path, list[str]] = {}
_SAID: set[Path] = set()


def splits_read(source: DataSource) -> list[str]:
    """The splits of a data folder or saved `DatasetDict` that `load_hf` read in this process
    (empty for one file, a saved `Dataset`, or a source not read here)."""
    return list(_SPLITS.get(source.path, []))


def unread_splits_asked(source: DataSource) -> None:
    """Leave `say_unread_splits` silent for this folder: its caller asks which split
    validates itself (`hpo.init` in a terminal), and the warning would say it twice."""
    _SAID.add(source.path)


def say_unread_splits(source: DataSource, read: list[str], splits: list[str] | None = None) -> None:
    """Say once per folder when it has splits beside the ones `read`: a user who ships a
    `test` split may expect the study to evaluate on it. `splits`: the folder's, as a cache
    recorded them; else those `load_hf` read in this process."""
    known = splits if splits is not None else _SPLITS.get(source.path, [])
    others = [name for name in known if name not in read]
    if others and source.path not in _SAID:
        _SAID.add(source.path)
        log.warning(
            "data %s: its %s split(s) are not read; the validation set is %s",
            source.path, ", ".join(others),
            f"its {read[1]} split" if len(read) > 1
            else "a share of its train split (--validation-split NAME validates on one)",
        )  # fmt: skip


def _csv_features(folder: Path) -> dict[str, Any]:
    """For a folder of CSV files: every column text (a CSV cell " 4" stays a completion)."""
    import datasets

    files = data_files(folder)
    if not files or any(path.suffix.lower() != ".csv" for path in files):
        return {}
    return {
        "features": datasets.Features(
            {name: datasets.Value("string") for name in _csv_header(files[0])}
        )
    }


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
