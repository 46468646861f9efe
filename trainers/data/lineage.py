"""The training data as an MLflow dataset input: what `mlflow.log_input` records on a run.

The fields are those of `mlflow.entities.Dataset` as plain strings, so the writer can spool
them during an outage like any other record: name, digest (the data's fingerprint, the one
the token cache is keyed by), source (the local path), schema (the columns of its record
shape, in MLflow's `mlflow_colspec` form, named as the data names them where `data_columns`
reads another column as a field) and profile (rows, shape, format, tokens, the mapping).
"""

from __future__ import annotations

import json
from typing import Any

from trainers.data.sources import (
    BadRecord,
    DataSource,
    fingerprint,
    open_source,
    records,
    with_columns,
    with_split,
)

# MLflow's store keeps at most 36 characters of a dataset digest.
DIGEST_LENGTH = 32
_ALPACA = ("instruction", "input", "output")


def _turns(*keys: str) -> dict[str, Any]:
    """A column of chat turns: a list of objects, each with these string fields (in order)."""
    properties = {key: {"type": "string", "required": True} for key in keys}
    return {"type": "array", "items": {"type": "object", "properties": properties}}


_COLUMNS: dict[str, list[tuple[str, Any]]] = {
    "text": [("text", "string")],
    "prompt_completion": [("prompt", "string"), ("completion", "string")],
    "messages": [("messages", _turns("content", "role"))],
    "alpaca": [(name, "string") for name in _ALPACA],
    "sharegpt": [("conversations", _turns("from", "value"))],
    # TRL's conversational prompt/completion: both lists of messages.
    "prompt_completion_chat": [("prompt", _turns("content", "role")), ("completion", _turns("content", "role"))],
}


def _conversational(source: DataSource) -> bool:
    """Whether the source's first record is a conversational prompt/completion one."""
    for _, record in records(source):
        if isinstance(record, dict):
            return isinstance(record.get("prompt"), list)
        if not isinstance(record, BadRecord):
            return False
    return False


def dataset_inputs(
    path: str,
    *,
    shape: str,
    rows: int,
    validation_split: str | None,
    validation_rows: int,
    columns: str | None = None,
) -> list[tuple[dict[str, str], str]]:
    """(dataset, context) of each MLflow dataset input of a run's data: the data in the
    `training` context; with a `validation_split`, the train split and that split in the
    `evaluation` context, each with its own rows.

    Args:
        path: The data file or folder.
        shape: Its record shape.
        rows: Usable records, of both splits.
        validation_split: The data's own split the run validates on, or None.
        validation_rows: Its usable records.
        columns: The run's `data_columns`, or None.
    """
    if not validation_split:
        return [(dataset_input(path, shape=shape, rows=rows, columns=columns), "training")]
    train_rows, held = rows - validation_rows, validation_split
    return [
        (dataset_input(path, shape=shape, rows=train_rows, split="train", columns=columns), "training"),
        (dataset_input(path, shape=shape, rows=validation_rows, split=held, columns=columns), "evaluation"),
    ]  # fmt: skip


def dataset_input(
    path: str,
    *,
    shape: str,
    rows: int,
    total_tokens: int | None = None,
    split: str | None = None,
    columns: str | None = None,
) -> dict[str, str]:
    """The `mlflow.entities.Dataset` fields of the data at `path`.

    Args:
        path: The data file or folder.
        shape: Its record shape (``trainers.data.records.SHAPES``).
        rows: Usable records.
        total_tokens: Tokens after tokenizing (train and validation), if known.
        split: One split of a folder or saved DatasetDict, named in the dataset's name
            (`data:test`), or None: the data as a run reads it.
        columns: The run's `data_columns` (FIELD=COLUMN, ...): the schema names each field by
            the data's column it is read from, as a user finds it in the data.
    """
    source = with_columns(open_source(path), columns)
    if split is not None:
        source = with_split(source, split)
    digest = fingerprint(source).removeprefix("datasets:")[:DIGEST_LENGTH]
    named = dict(source.columns)
    schema = [
        {"type": kind, "name": named.get(name, name), "required": True}
        if isinstance(kind, str)
        else {**kind, "name": named.get(name, name), "required": True}
        for name, kind in _COLUMNS[
            "prompt_completion_chat"
            if shape == "prompt_completion" and _conversational(source)
            else shape
        ]
    ]
    profile: dict[str, Any] = {"num_rows": rows, "shape": shape, "format": source.kind}
    if split is not None:
        profile["split"] = split
    if source.columns:
        profile["data_columns"] = ",".join(f"{f}={c}" for f, c in source.columns)
    if total_tokens is not None:
        profile["total_tokens"] = total_tokens
    return {
        "name": source.path.name + (f":{split}" if split is not None else ""),
        "digest": digest,
        "source_type": "local",
        "source": json.dumps({"uri": str(source.path.resolve())}),
        "schema": json.dumps({"mlflow_colspec": schema}),
        "profile": json.dumps(profile),
    }
