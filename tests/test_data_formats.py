"""Data in the formats users keep it in, read by the real `datasets`: Parquet, CSV, JSON,
`save_to_disk` folders, Alpaca and ShareGPT rows; bad rows named by number; the cache key."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import pandas as pd
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from common.errors import BadInputError
from trainers.data.dataset import DataSpec, TokenizedData, load_tokenized
from trainers.data.records import read_native
from trainers.data.sources import open_source, with_columns

PROMPTS = [{"prompt": f"Q{i}: what is {i} plus {i}?", "completion": f" {2 * i}"} for i in range(12)]
ALPACA = [
    {"instruction": f"Add {i} and {i}.", "input": "" if i % 2 else f"Show it for {i}.",
     "output": f"{2 * i}"}
    for i in range(12)
]  # fmt: skip
SHAREGPT = [
    {"conversations": [{"from": "human", "value": f"hi {i}"}, {"from": "gpt", "value": f"yo {i}"}]}
    for i in range(12)
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def _csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _json_array(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(rows), encoding="utf-8")
    return path


def _saved(path: Path, rows: list[dict[str, Any]]) -> Path:
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def _saved_dict(path: Path, rows: list[dict[str, Any]]) -> Path:
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(path))
    return path


def _hub_folder(path: Path, rows: list[dict[str, Any]]) -> Path:
    """A dataset repository as the Hub lays it out: train shards and a test split."""
    (path / "data").mkdir(parents=True)
    half = len(rows) // 2
    _parquet(path / "data" / "train-00000-of-00002.parquet", rows[:half])
    _parquet(path / "data" / "train-00001-of-00002.parquet", rows[half:])
    _parquet(path / "data" / "test-00000-of-00001.parquet", [{"prompt": "Q?", "completion": " held out"}])
    (path / "README.md").write_text("# a dataset\n", encoding="utf-8")
    return path


def _jsonl_shards(path: Path, rows: list[dict[str, Any]]) -> Path:
    """A folder of JSONL shards whose names say no split: all of them train."""
    (path / ".cache").mkdir(parents=True)  # hidden: not data
    (path / ".cache" / "x.jsonl").write_text('{"text": "not data"}\n', encoding="utf-8")
    for number, start in enumerate(range(0, len(rows), 5)):
        _jsonl(path / f"part-{number}.jsonl", rows[start : start + 5])
    return path


def _csv_shards(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.mkdir()
    _csv(path / "a.csv", rows[:6])
    _csv(path / "b.csv", rows[6:])
    return path


WRITERS: dict[str, tuple[str, Callable[[Path, list[dict[str, Any]]], Path]]] = {
    "parquet": ("d.parquet", _parquet),
    "csv": ("d.csv", _csv),
    "json array": ("d.json", _json_array),
    "save_to_disk folder": ("saved", _saved),
    "save_to_disk DatasetDict": ("saved-dict", _saved_dict),
    "Hub folder of Parquet shards": ("hub", _hub_folder),
    "folder of JSONL shards": ("shards", _jsonl_shards),
    "folder of CSV files": ("csvs", _csv_shards),
}


def _load(
    path: Path, tok: PreTrainedTokenizerBase, cache: Path, max_length: int = 128
) -> TokenizedData:
    return load_tokenized(DataSpec(path=str(path), cache_dir=str(cache), max_length=max_length), tok)


def _samples(data: TokenizedData) -> list[tuple[list[int], list[int]]]:
    return [(e.input_ids, e.labels) for e in data.train + data.validation]


@pytest.mark.parametrize("kind", list(WRITERS))
def test_every_format_gives_the_tokens_of_the_same_jsonl(
    kind: str, tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    name, write = WRITERS[kind]
    reference = _load(_jsonl(tmp_path / "d.jsonl", PROMPTS), tokenizer, tmp_path / "c1")
    data = _load(write(tmp_path / name, PROMPTS), tokenizer, tmp_path / "c2")
    assert data.stats.shape == "prompt_completion"
    assert _samples(data) == _samples(reference)


@pytest.mark.parametrize(
    ("rows", "shape", "as_messages"),
    [
        (
            ALPACA,
            "alpaca",
            [
                {"messages": [
                    {"role": "user", "content": r["instruction"] + (f"\n\n{r['input']}" if r["input"] else "")},
                    {"role": "assistant", "content": r["output"]},
                ]}
                for r in ALPACA
            ],
        ),
        (
            SHAREGPT,
            "sharegpt",
            [
                {"messages": [
                    {"role": "user", "content": r["conversations"][0]["value"]},
                    {"role": "assistant", "content": r["conversations"][1]["value"]},
                ]}
                for r in SHAREGPT
            ],
        ),
    ],
    ids=["alpaca", "sharegpt"],
)  # fmt: skip
@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_alpaca_and_sharegpt_train_as_their_conversations(
    rows: list[dict[str, Any]],
    shape: str,
    as_messages: list[dict[str, Any]],
    kind: str,
    tmp_path: Path,
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    write = _jsonl if kind == "jsonl" else _parquet
    data = _load(write(tmp_path / f"d.{kind}", rows), tokenizer, tmp_path / "c1")
    reference = _load(_jsonl(tmp_path / "m.jsonl", as_messages), tokenizer, tmp_path / "c2")
    assert data.stats.shape == shape
    assert _samples(data) == _samples(reference)


def test_sharegpt_system_field_leads_the_conversation(tmp_path: Path) -> None:
    row = {"system": "Be brief.", **SHAREGPT[0]}
    _, native, _ = read_native(_jsonl(tmp_path / "s.jsonl", [row]))
    assert [m["role"] for m in native[0]["messages"]] == ["system", "user", "assistant"]


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_sharegpt_tool_turns_train_as_tool_messages(
    kind: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """LLaMA-Factory's ShareGPT tool turns (`function_call`: the JSON of a call, arguments
    as a JSON string too; `observation`: its result; `tools`: the JSON of the functions)
    train as the messages record with `tool_calls`, a `tool` message and `tools`."""
    import trl.chat_template_utils as shipped

    from tests.configs import TOOL_CHAT

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = shipped.qwen2_5_chat_template
    call = {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}
    row = {
        "conversations": [
            {"from": "human", "value": "Weather in Paris?"},
            {"from": "function_call", "value": json.dumps(call)},
            {"from": "observation", "value": "sunny, 21 C"},
            {"from": "gpt", "value": "It is sunny in Paris."},
        ],
        "tools": json.dumps([t["function"] for t in TOOL_CHAT["tools"]]),
    }
    write = _jsonl if kind == "jsonl" else _parquet
    data = _load(write(tmp_path / f"d.{kind}", [row, *SHAREGPT[:3]]), tok, tmp_path / "c1", 2048)
    reference = _load(_jsonl(tmp_path / "m.jsonl", [TOOL_CHAT, *[
        {"messages": [{"role": "user", "content": r["conversations"][0]["value"]},
                      {"role": "assistant", "content": r["conversations"][1]["value"]}]}
        for r in SHAREGPT[:3]
    ]]), tok, tmp_path / "c2", 2048)  # fmt: skip
    assert data.stats.shape == "sharegpt" and data.stats.truncated == 0
    assert _samples(data) == _samples(reference)
    called = [e for e in data.train + data.validation if "get_weather" in tok.decode(e.input_ids)]
    assert len(called) == 1 and "get_weather" in tok.decode(
        [t for t, label in zip(called[0].input_ids, called[0].labels, strict=True) if label != -100]
    )
    bad = {"conversations": [{"from": "human", "value": "a"}, {"from": "function_call", "value": "x("}]}
    with pytest.raises(BadInputError, match=r"bad\.jsonl:1: a function_call value must be the JSON"):
        _load(_jsonl(tmp_path / "bad.jsonl", [bad]), tok, tmp_path / "c3")


BAD_ROWS: dict[str, tuple[str, list[dict[str, Any]], str]] = {
    "parquet, wrong type": (
        "bad.parquet",
        [*PROMPTS[:2], {"prompt": "x", "completion": None}],
        "bad.parquet: row 3: field 'completion' must be a string, got null",
    ),
    "csv, empty cell": (
        "bad.csv",
        [PROMPTS[0], {"prompt": "x", "completion": ""}],
        "bad.csv: row 2: field 'completion' must be a string, got null",
    ),
    "json array, alpaca without output": (
        "bad.json",
        [ALPACA[0], {"instruction": "Do it.", "input": "", "output": ""}],
        "bad.json: row 2: field 'output' is empty",
    ),
    "sharegpt, unknown role": (
        "bad-share.jsonl",
        [SHAREGPT[0], {"conversations": [{"from": "human", "value": "a"}, {"from": "tool", "value": "b"}]}],
        "bad-share.jsonl:2: conversations[1] has unknown role 'tool' "
        "(expected human, gpt, system, function_call or observation)",
    ),
    "sharegpt in a folder, assistant first": (
        "bad-saved",
        [SHAREGPT[0], {"conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "b"}]}],
        "bad-saved: row 2: conversations[0] is an assistant message",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_a_bad_row_is_named_by_its_number(
    case: str, tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    name, rows, message = BAD_ROWS[case]
    path = tmp_path / name
    if name.endswith(".jsonl"):
        _jsonl(path, rows)
    elif name.endswith(".json"):
        _json_array(path, rows)
    else:
        {"parquet": _parquet, "csv": _csv}.get(path.suffix.lstrip("."), _saved)(path, rows)
    with pytest.raises(BadInputError) as raised:
        _load(path, tokenizer, tmp_path / "cache")
    assert str(raised.value).endswith(message) or message in str(raised.value)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: _file(tmp / "d.txt", "hello"), "unsupported file type '.txt'"),
        (lambda tmp: _file(tmp / "d.parquet", "not parquet"), "cannot be read as parquet"),
        (lambda tmp: _mkdir(tmp / "plain-folder"), "a directory with no data files"),
        (lambda tmp: Path("databricks/databricks-dolly-15k"), r"a Hub dataset\? .*--local-dir DIR"),
        (lambda tmp: _test_only(tmp / "test-only"), r"a folder without a 'train' split \(it has test\)"),
    ],
    ids=["unknown suffix", "corrupt parquet", "plain folder", "folder without train", "hub name"],
)
def test_unreadable_data_is_one_line(
    make: Callable[[Path], Path], message: str, tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    with pytest.raises(BadInputError, match=message) as raised:
        _load(make(tmp_path), tokenizer, tmp_path / "cache")
    assert "\n" not in str(raised.value)


def _file(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _test_only(path: Path) -> Path:
    (path / "data").mkdir(parents=True)
    return _parquet(path / "data" / "test-00000-of-00001.parquet", PROMPTS).parent.parent


def test_a_folder_of_shards_is_keyed_by_its_files_and_names_its_bad_rows(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase, caplog: pytest.LogCaptureFixture
) -> None:
    """A Hub dataset folder: its test split is said once not to be read; the cache hits on
    the same files and misses when a shard changes; a bad row is named by its number in
    the train split."""
    folder = _hub_folder(tmp_path / "hub", PROMPTS)
    first = _load(folder, tokenizer, tmp_path / "cache")
    again = _load(folder, tokenizer, tmp_path / "cache")
    assert (first.cache_hit, again.cache_hit) == (False, True)
    said = [r.getMessage() for r in caplog.records if "split(s) are not read" in r.getMessage()]
    assert len(said) == 1 and "its test split(s)" in said[0]
    assert "held out" not in str(_samples(first))
    changed = [dict(row) for row in PROMPTS]
    changed[-1]["completion"] = " 99"
    _parquet(folder / "data" / "train-00001-of-00002.parquet", changed[len(PROMPTS) // 2 :])
    other = _load(folder, tokenizer, tmp_path / "cache")
    assert not other.cache_hit and other.cache_path != first.cache_path

    bad = [dict(row) for row in PROMPTS]
    bad[8]["completion"] = None
    with pytest.raises(BadInputError, match=r"bad: row 9 of its train split: field 'completion' must be a string"):
        _load(_jsonl_shards(tmp_path / "bad", bad), tokenizer, tmp_path / "cache")


def test_a_later_process_that_hits_the_cache_still_says_the_splits_it_leaves_out(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase, caplog: pytest.LogCaptureFixture
) -> None:
    """A study's next session, or a worker, reads the tokenized cache and not the folder:
    the splits it recorded say what the folder holds beside train."""
    from trainers.data import sources

    folder = _hub_folder(tmp_path / "hub", PROMPTS)
    assert not _load(folder, tokenizer, tmp_path / "cache").cache_hit
    sources._SAID.clear()  # a new process: nothing said, nothing read
    sources._SPLITS.clear()
    caplog.clear()
    assert _load(folder, tokenizer, tmp_path / "cache").cache_hit
    said = [r.getMessage() for r in caplog.records if "split(s) are not read" in r.getMessage()]
    assert len(said) == 1 and "its test split(s)" in said[0]


def test_a_folders_own_split_is_the_validation_set(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase, caplog: pytest.LogCaptureFixture
) -> None:
    """`validation_split` names a split of a Hub folder or a saved DatasetDict: its records
    are the validation samples, in order, and the whole train split trains. A split the data
    lacks, a single file, or a split of another record shape stops in one line naming it."""
    held = [{"prompt": f"H{i}: what is {i} times 3?", "completion": f" {3 * i}"} for i in range(5)]
    folder = _hub_folder(tmp_path / "hub", PROMPTS)
    _parquet(folder / "data" / "test-00000-of-00001.parquet", held)
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(PROMPTS), "validation": datasets.Dataset.from_list(held)}
    ).save_to_disk(str(saved))
    from trainers.data.records import read_pieces, tokenize_pieces

    def in_order(rows: list[dict[str, Any]], name: str) -> list[tuple[list[int], list[int]]]:
        return tokenize_pieces(read_pieces(_jsonl(tmp_path / name, rows), tokenizer)[1], tokenizer)

    alone, everything = in_order(held, "held.jsonl"), in_order(PROMPTS, "train.jsonl")
    for path, split in [(folder, "test"), (saved, "validation")]:
        spec = DataSpec(path=str(path), cache_dir=str(tmp_path / "cache"), max_length=128, validation_split=split)
        data = load_tokenized(spec, tokenizer)
        assert [(e.input_ids, e.labels) for e in data.validation] == alone
        assert [(e.input_ids, e.labels) for e in data.train] == everything
        again = load_tokenized(spec, tokenizer)
        assert again.cache_hit and [e.input_ids for e in again.validation] == [e.input_ids for e in data.validation]
        shared = _load(path, tokenizer, tmp_path / "cache")  # the default: a share of train
        assert not shared.cache_hit and len(shared.validation) == 1
    # Said once a folder, by the loads that leave a split out: the default ones.
    said = [r.getMessage() for r in caplog.records if "split(s) are not read" in r.getMessage()]
    assert len(said) == 2 and all("--validation-split NAME validates on one" in m for m in said)
    assert "hub: its test split(s)" in said[0] and "saved: its validation split(s)" in said[1]

    def refused(path: Path, split: str) -> str:
        with pytest.raises(BadInputError) as raised:
            load_tokenized(DataSpec(path=str(path), cache_dir=str(tmp_path / "c1"), validation_split=split), tokenizer)
        assert "\n" not in str(raised.value)
        return str(raised.value)

    assert "a folder without a 'dev' split (it has train, test)" in refused(folder, "dev")
    assert "one file, without splits: validation_split 'test'" in refused(tmp_path / "train.jsonl", "test")
    assert "must name a split other than 'train'" in refused(folder, "train")
    _parquet(folder / "data" / "test-00000-of-00001.parquet", [{"text": "plain text"}] * 3)
    # `datasets` reads a folder's splits with one set of columns.
    assert "because column names don't match" in refused(folder, "test")
    mixed = tmp_path / "mixed"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(PROMPTS), "test": datasets.Dataset.from_list([{"text": "x"}] * 3)}
    ).save_to_disk(str(mixed))
    assert "its test split holds text records, its train split prompt_completion" in refused(mixed, "test")
    _parquet(folder / "data" / "test-00000-of-00001.parquet", [*held[:2], {"prompt": None, "completion": " x"}])
    assert "hub: row 3 of its test split: field 'prompt' must be a string" in refused(folder, "test")


def test_the_cache_is_keyed_by_the_saved_folders_fingerprint(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    folder = _saved(tmp_path / "saved", PROMPTS)
    first = _load(folder, tokenizer, tmp_path / "cache")
    again = _load(folder, tokenizer, tmp_path / "cache")
    assert (first.cache_hit, again.cache_hit) == (False, True)
    assert again.cache_path == first.cache_path
    # Changed records saved over the folder: a new fingerprint, so no stale tokens.
    changed = datasets.Dataset.from_list(PROMPTS).map(lambda r: {"completion": r["completion"] + "!"})
    changed.save_to_disk(str(tmp_path / "saved-2"))
    other = _load(tmp_path / "saved-2", tokenizer, tmp_path / "cache")
    assert not other.cache_hit and other.cache_path != first.cache_path
    assert _samples(other) != _samples(first)


def test_the_plans_character_estimate_reads_every_format(tmp_path: Path) -> None:
    """`analysis.plan --data` without a tokenizer: the same lengths from Parquet as from JSONL."""
    from analysis.planning.inputs import lengths_from_data

    def lengths(path: Path) -> tuple[int, ...]:
        return lengths_from_data(str(path), max_length=64, tokenizer_dir=None)[0]

    jsonl = lengths(_jsonl(tmp_path / "d.jsonl", PROMPTS))
    parquet = lengths(_parquet(tmp_path / "d.parquet", PROMPTS))
    assert parquet == jsonl and len(jsonl) == len(PROMPTS) - round(len(PROMPTS) * 0.1)
    # Alpaca rows count their instruction, input and output.
    assert min(lengths(_csv(tmp_path / "a.csv", ALPACA))) >= 2


DOLLY = [
    {"instruction": f"Add {i} and {i}.", "context": "" if i % 2 else f"Show it for {i}.",
     "response": f"{2 * i}", "category": "math"}
    for i in range(12)
]  # fmt: skip


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_data_columns_read_another_layout_as_a_known_shape(
    kind: str, tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    """Dolly's columns (instruction, context, response) refused as they are, in one line that
    names them and the flag; read through `data_columns` they train as the same records in
    Alpaca's columns, cached apart; a malformed mapping stops before anything is read."""
    write = {"jsonl": _jsonl, "parquet": _parquet}[kind]
    dolly = write(tmp_path / f"dolly.{kind}", DOLLY)
    with pytest.raises(BadInputError, match=r"1: missing field 'output' \(--data-columns output=COLUMN"):
        _load(dolly, tokenizer, tmp_path / "c0")
    qa = _jsonl(tmp_path / "qa.jsonl", [{"question": "Q", "answer": "A"}])
    with pytest.raises(BadInputError, match=r"field, only 'answer', 'question' \(--data-columns FIELD=COLUMN"):
        _load(qa, tokenizer, tmp_path / "c0")
    as_alpaca = [{"instruction": r["instruction"], "input": r["context"], "output": r["response"]} for r in DOLLY]
    reference = _load(_jsonl(tmp_path / "alpaca.jsonl", as_alpaca), tokenizer, tmp_path / "c1")
    spec = DataSpec(path=str(dolly), cache_dir=str(tmp_path / "c2"), max_length=128,
                    data_columns="output=response, input=context")  # fmt: skip
    data = load_tokenized(spec, tokenizer)
    assert data.stats.shape == "alpaca" and _samples(data) == _samples(reference)
    plain = DataSpec(path=str(_jsonl(tmp_path / "same.jsonl", as_alpaca)), cache_dir=str(tmp_path / "c2"), max_length=128)
    assert not load_tokenized(plain, tokenizer).cache_hit  # the mapping is in the key
    # A typo in a column is named as the column, not as hpo's field; a record failing for
    # its own reason keeps that reason though an optional field's column is absent.
    typo = DataSpec(path=str(dolly), cache_dir=str(tmp_path / "c3"), max_length=128,
                    data_columns="output=respons, input=context")  # fmt: skip
    with pytest.raises(BadInputError) as refused:
        load_tokenized(typo, tokenizer)
    assert str(refused.value).endswith(
        "1: no column 'respons' (--data-columns output=respons); the record's columns: "
        "instruction, response, category, context"
    ), refused.value
    empty = _jsonl(tmp_path / "empty.jsonl", [{"instruction": "", "response": "4"}])
    with pytest.raises(BadInputError, match=r"1: field 'instruction' is empty$"):
        read_native(with_columns(open_source(empty), "output=response,input=context"))
    from analysis.planning.inputs import lengths_from_data

    planned = lengths_from_data(str(dolly), max_length=64, tokenizer_dir=None, columns="output=response,input=context")
    assert planned[0] == lengths_from_data(str(tmp_path / "alpaca.jsonl"), max_length=64, tokenizer_dir=None)[0]
    for text, message in [
        ("output", "must be FIELD=COLUMN pairs"),
        ("answer=response", "'answer' is not a field hpo reads"),
        ("output=response,output=context", "names a field twice"),
    ]:
        with pytest.raises(BadInputError, match=message):
            DataSpec(path=str(dolly), data_columns=text)
