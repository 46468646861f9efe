"""Chat data in `hpo.export --format trl`: `trl sft` takes the loss where hpo's trainer does.

Each case exports a chat data set for a copy of the tiny model with another chat template,
trains it one step with `trl sft`'s own main, and compares the labels TRL's collator builds
for every training sample with the labels `trainers.data.records` gives the same record.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpo.export_formats import write_format
from trainers.data.records import fallback_chat_template, read_pieces, tokenize_pieces
from trainers.preset import preset_dict
from trainers.spec import TrainSpec
from trainers.tiny import CHAT_TEMPLATE

ESTIMATE = {
    "duration_hours": {"p10": 0.5, "p50": 1.0, "p90": 1.5},
    "full_run_steps": 1,
    "window_hours": 2.0,
    "hardware": {"device_kind": "cpu", "device_name": "cpu", "precision": "fp32"},
}
# The tiny template with `{% generation %}` around what hpo's rule labels in it: an
# assistant's content, its eos and the newline the template adds inside the turn.
MARKED = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + eos_token + '\\n' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def _model_with(template: str | None, source: Path, out: Path) -> Path:
    """A copy of the tiny model whose tokenizer has `template` (None: no chat template)."""
    from transformers import AutoTokenizer

    shutil.copytree(source, out)
    for saved in out.glob("chat_template.j*"):
        saved.unlink()
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(out)
    assert bool(AutoTokenizer.from_pretrained(out).chat_template) == (template is not None)
    return out


def _chats(path: Path, exchanges: int, count: int = 24) -> Path:
    rows = []
    for i in range(count):
        messages = [{"role": "system", "content": "Answer briefly."}]
        for k in range(exchanges):
            messages += [
                {"role": "user", "content": f"What is colour {i}.{k}?"},
                {"role": "assistant", "content": f"It is red {i}.{k}."},
            ]
        rows.append({"messages": messages})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _export(model: Path, data: Path, out: Path, max_length: int = 160) -> list[Path]:
    spec = TrainSpec(
        model=str(model), data=str(data), micro_batch_size=4, max_length=max_length, max_steps=1
    )
    preset = preset_dict(spec, estimate=ESTIMATE, provenance={"study": "chat", "trial": 1})
    return write_format("trl", preset, out)


def _trl_labels(config: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of every training sample, as TRL's collator gives them to the model
    in a one-step `trl sft` run of `config`."""
    from trl import SFTTrainer
    from trl.scripts.sft import main, make_parser

    trainers: list[Any] = []
    train = SFTTrainer.train

    def keep(trainer: Any, *args: Any, **kwargs: Any) -> Any:
        trainers.append(trainer)
        return train(trainer, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "train", keep)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_TAGS"):
        monkeypatch.delenv(name, raising=False)
    args = ["--config", str(config), "--eval_strategy", "no", "--save_strategy", "no"]
    parsed = make_parser(prog="trl sft").parse_args_and_config(
        args, return_remaining_strings=True, separate_remaining_strings=True
    )
    main(*parsed[:4])
    (trainer,) = trainers
    samples = []
    for sample in trainer.train_dataset:
        batch = trainer.data_collator([sample])
        samples.append((batch["input_ids"][0].tolist(), batch["labels"][0].tolist()))
    return samples


def _spans(tokenizer: Any, ids: list[int], labels: list[int]) -> tuple[str, list[str]]:
    """A sample's text and the text of each run of tokens that carries loss."""
    spans, run = [], []
    for token, label in zip(ids, labels, strict=True):
        if label != -100:
            run.append(token)
        elif run:
            spans.append(tokenizer.decode(run))
            run = []
    if run:
        spans.append(tokenizer.decode(run))
    return tokenizer.decode(ids), spans


def _tokenized_match(
    model: Path, data: Path, config: Path, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[str, list[str]]]:
    """Train `config` one step with `trl sft`; every sample it trains has the token ids and
    labels hpo's trainer gives one of `data`'s records. Returns each sample's text and the
    text of its runs of labelled tokens."""
    from trainers.model.lora import load_tokenizer

    tokenizer = load_tokenizer(str(model))
    _, pieces, _ = read_pieces(data, tokenizer)
    hpo = {tuple(ids): labels for ids, labels in tokenize_pieces(pieces, tokenizer)}
    samples = _trl_labels(config, monkeypatch)
    assert len(samples) >= 20  # all but the few it holds out
    for ids, labels in samples:
        assert labels == hpo[tuple(ids)]  # the same tokens, the same tokens carry loss
    return [_spans(tokenizer, ids, labels) for ids, labels in samples]


def _hpo_spans(model: Path, data: Path) -> dict[str, list[str]]:
    from trainers.model.lora import load_tokenizer

    tokenizer = load_tokenizer(str(model))
    _, pieces, _ = read_pieces(data, tokenizer)
    return dict(_spans(tokenizer, ids, labels) for ids, labels in tokenize_pieces(pieces, tokenizer))


@pytest.mark.parametrize(
    ("template", "exchanges", "written", "flag"),
    [
        # No chat template: TRL cannot render chat records at all without the one written.
        (None, 2, {".chat_template.jinja"}, "assistant_only_loss"),
        # One reply a record, a template without markers: conversational prompt/completion.
        (CHAT_TEMPLATE, 1, {".data.jsonl"}, "completion_only_loss"),
        # Several replies, a template that marks them.
        (MARKED, 2, set(), "assistant_only_loss"),
    ],
    ids=["no-template", "one-reply", "marked-template"],
)
def test_trl_takes_the_loss_on_the_tokens_hpo_trains(
    template: str | None,
    exchanges: int,
    written: set[str],
    flag: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _model_with(template, tiny_model_dir, tmp_path / "model")
    data = _chats(tmp_path / "chat.jsonl", exchanges)
    config, *extra = _export(model, data, tmp_path / "trl.yaml")
    assert {path.name.removeprefix("trl") for path in extra} == written
    assert yaml.safe_load(config.read_text())[flag] is True
    assert "every token" not in config.read_text()

    hpo = _hpo_spans(model, data)
    samples = _trl_labels(config, monkeypatch)
    assert len(samples) >= 20  # all but the few it holds out
    from trainers.model.lora import load_tokenizer

    tokenizer = load_tokenizer(str(model))
    for ids, labels in samples:
        text, spans = _spans(tokenizer, ids, labels)
        assert spans == hpo[text]  # the same sample, the same tokens carry loss
        assert len(spans) == exchanges and all(span.startswith("It is red") for span in spans)


def test_a_template_trl_knows_a_training_version_of(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen2.5's template has no markers; TRL's training version of it is written beside the
    config, so the replies alone carry loss (a TRL that would not swap it in reads it too)."""
    from trl.chat_template_utils import qwen2_5_chat_template

    model = _model_with(qwen2_5_chat_template, tiny_model_dir, tmp_path / "model")
    data = _chats(tmp_path / "chat.jsonl", 2)
    config, written = _export(model, data, tmp_path / "trl.yaml", max_length=400)
    assert written.name == "trl.chat_template.jinja" and "generation" in written.read_text()
    assert yaml.safe_load(config.read_text())["chat_template_path"] == str(written)

    hpo = _hpo_spans(model, data)
    from trainers.model.lora import load_tokenizer

    tokenizer = load_tokenizer(str(model))
    samples = _trl_labels(config, monkeypatch)
    assert samples
    for ids, labels in samples:
        _, spans = _spans(tokenizer, ids, labels)
        # TRL's markers and hpo's rule may draw a turn's edge a newline apart: the same
        # replies carry loss, and nothing of the system or user messages does.
        assert len(spans) == 2 and "colour" not in "".join(spans)
        (hpo_spans,) = {tuple(s) for t, s in hpo.items() if spans[0].strip() in t}
        assert [s.strip() for s in spans] == [s.strip() for s in hpo_spans]


def test_a_template_neither_marked_nor_known_gets_hpos_own_tokens(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several replies and a template neither marked nor known to TRL (the tiny model's, like
    Mistral's): the records go to TRL tokenized, hpo's labels as `assistant_masks`, so every
    sample TRL trains carries hpo's ids and labels exactly, one-reply records as well."""
    data = tmp_path / "chat.jsonl"
    rows = [json.loads(line) for line in _chats(tmp_path / "two.jsonl", 2, 6).read_text().splitlines()]
    rows += [json.loads(line) for line in _chats(tmp_path / "one.jsonl", 1, 18).read_text().splitlines()]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config, written = _export(tiny_model_dir, data, tmp_path / "trl.yaml")
    assert written.name == "trl.data.jsonl"
    text = config.read_text()
    assert "the records tokenized as hpo trains them" in text and "every token" not in text
    parsed = yaml.safe_load(text)
    assert "assistant_only_loss" not in parsed and "chat_template_path" not in parsed

    samples = _tokenized_match(tiny_model_dir, data, config, monkeypatch)
    assert any(len(spans) == 2 for _, spans in samples)
    for text, spans in samples:
        assert spans and "colour" not in "".join(spans) and "".join(spans) != text


def test_a_saved_datasetdicts_chat_splits_go_to_trl_each_as_its_own(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Chat records of a saved `DatasetDict`, validated on its validation split, tokenized for
    TRL (several replies): the train records the template cannot render are left out as hpo
    skips them, and the rows after them still go to the split they came from."""
    import datasets
    from transformers import AutoTokenizer

    refusing = (
        "{% for m in messages %}{% if m['content'] == 'refuse' %}{{ raise_exception('no') }}"
        "{% endif %}{% endfor %}"
    )
    model = _model_with(refusing + CHAT_TEMPLATE, tiny_model_dir, tmp_path / "model")

    def chats(split: str, count: int) -> list[dict[str, Any]]:
        rows = []
        for i in range(count):
            messages = [{"role": "system", "content": "Answer briefly."}]
            for k in range(2):
                messages += [
                    {"role": "user", "content": f"Colour {k}?"},
                    {"role": "assistant", "content": f"{split} {i}.{k}"},
                ]
            rows.append({"messages": messages})
        return rows

    train = chats("train", 20)
    train[3]["messages"][4]["content"] = "refuse"
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(train),
         "validation": datasets.Dataset.from_list(chats("held", 10))}
    ).save_to_disk(str(saved))  # fmt: skip
    spec = TrainSpec(
        model=str(model), data=str(saved), micro_batch_size=4, max_length=160, max_steps=1,
        validation_split="validation", eval_samples=4,
    )  # fmt: skip
    preset = preset_dict(spec, estimate=ESTIMATE, provenance={"study": "chat", "trial": 1})
    config, trained, evaluated = write_format("trl", preset, tmp_path / "trl.yaml")
    assert "1 records the template cannot render left out" in config.read_text()
    tokenizer = AutoTokenizer.from_pretrained(model)

    def replies(path: Path) -> list[str]:  # each record's first reply: "train 0.0", ...
        lines = path.read_text().splitlines()
        texts = [tokenizer.decode(json.loads(line)["input_ids"]) for line in lines]
        return [re.findall(r"(?:train|held) \d+\.0", text)[0] for text in texts]

    assert replies(trained) == [f"train {i}.0" for i in range(20) if i != 3]
    assert replies(evaluated) == [f"held {i}.0" for i in range(4)]


def _shipped(name: str) -> str:
    import trl.chat_template_utils as shipped

    return str(getattr(shipped, f"{name}_chat_template"))


@pytest.mark.parametrize(
    ("family", "exchanges"),
    [
        # The system message joins the last user turn, dropped once a reply is last.
        ("mistral-v0.3-like", 1),
        # The last reply gets an empty think block the earlier ones lack.
        ("qwen3", 2),
        # A system message refused: hpo joins it to the first user turn.
        ("gemma", 1),
    ],
)
def test_a_template_that_renders_the_last_reply_otherwise_goes_tokenized(
    family: str, exchanges: int, tmp_path: Path, tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Templates no rendering of a whole conversation trains as hpo does (as the model sees
    it when it writes its last reply): as prompt/completion TRL would render the prompt one
    way and the record another and mask by the prompt's length, and TRL's training templates
    mark every reply as a last one. The records go tokenized as hpo trains them: every
    sample TRL trains has the system message and hpo's ids and labels."""
    from tests.configs import SYSTEM_IN_LAST_TURN

    template = SYSTEM_IN_LAST_TURN if family == "mistral-v0.3-like" else _shipped(family)
    model = _model_with(template, tiny_model_dir, tmp_path / "model")
    data = _chats(tmp_path / "chat.jsonl", exchanges)
    config, written = _export(model, data, tmp_path / "trl.yaml", max_length=400)
    assert written.name == "trl.data.jsonl"
    text = config.read_text()
    assert "24 of 24 records rendered by the chat template otherwise" in text
    parsed = yaml.safe_load(text)
    assert "completion_only_loss" not in parsed and "chat_template_path" not in parsed

    for text, spans in _tokenized_match(model, data, config, monkeypatch):
        assert "Answer briefly." in text and len(spans) == exchanges
        assert all("It is red" in span and "colour" not in span for span in spans)


def test_reasoning_goes_to_trl_with_its_reply(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply's `reasoning_content` stays on the exported records, so TRL's rendering of
    the reply (Qwen3's template: its think block) carries it with the loss, as hpo's does."""
    model = _model_with(_shipped("qwen3"), tiny_model_dir, tmp_path / "model")
    rows = [json.loads(line) for line in _chats(tmp_path / "c.jsonl", 1).read_text().splitlines()]
    for i, row in enumerate(rows):
        row["messages"][-1]["reasoning_content"] = f"Colour {i} is red."
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config, written = _export(model, data, tmp_path / "trl.yaml", max_length=400)
    assert yaml.safe_load(config.read_text())["completion_only_loss"] is True
    assert "reasoning_content" in written.read_text()

    from trainers.model.lora import load_tokenizer

    tokenizer = load_tokenizer(str(model))
    hpo = _hpo_spans(model, data)
    samples = _trl_labels(config, monkeypatch)
    assert len(samples) >= 20
    for ids, labels in samples:
        text, spans = _spans(tokenizer, ids, labels)
        assert spans == hpo[text] and len(spans) == 1
        assert "is red." in spans[0] and "<think>" in spans[0]


def test_chat_template_kwargs_go_to_trl_on_every_record(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records that set `chat_template_kwargs` beside records that do not (Qwen3's
    `enable_thinking: false` on every other one): the exported rows keep them, `{}` on the
    others (TRL reads `**example.get("chat_template_kwargs", {})`, and `datasets` gives a
    record without them None, which TRL cannot unpack), so TRL labels every sample as hpo:
    the reply alone where thinking is off, the empty think block and the reply elsewhere."""
    model = _model_with(_shipped("qwen3"), tiny_model_dir, tmp_path / "model")
    rows = [json.loads(line) for line in _chats(tmp_path / "c.jsonl", 1).read_text().splitlines()]
    for row in rows[::2]:
        row["chat_template_kwargs"] = {"enable_thinking": False}
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config, written = _export(model, data, tmp_path / "trl.yaml", max_length=400)
    assert yaml.safe_load(config.read_text())["completion_only_loss"] is True
    exported = [json.loads(line) for line in written.read_text().splitlines()]
    assert [row["chat_template_kwargs"] for row in exported[:2]] == [{"enable_thinking": False}, {}]

    from trainers.model.lora import load_tokenizer

    tokenizer = load_tokenizer(str(model))
    hpo = _hpo_spans(model, data)
    samples = _trl_labels(config, monkeypatch)
    assert len(samples) >= 20
    thinking = []
    for ids, labels in samples:
        text, spans = _spans(tokenizer, ids, labels)
        assert spans == hpo[text] and len(spans) == 1 and "is red" in spans[0]
        thinking.append("<think>" in spans[0])
    assert 5 <= sum(thinking) <= len(thinking) - 5  # both kinds trained

    # A file TRL would read as it is (a template with markers): rewritten, `{}` filled in.
    marked = _model_with(MARKED, tiny_model_dir, tmp_path / "marked")
    rows = [json.loads(line) for line in _chats(tmp_path / "two.jsonl", 2).read_text().splitlines()]
    rows[3]["chat_template_kwargs"] = {"enable_thinking": False}
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config, written = _export(marked, data, tmp_path / "marked.yaml")
    assert yaml.safe_load(config.read_text())["assistant_only_loss"] is True
    assert yaml.safe_load(config.read_text())["datasets"][0]["data_files"] == str(written.resolve())
    assert all("chat_template_kwargs" in json.loads(line) for line in written.read_text().splitlines())
    assert len(_trl_labels(config, monkeypatch)) >= 20


def test_tool_calls_go_to_trl_tokenized_as_hpo_trains_them(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records with tools and tool calls (Qwen 2.5's template renders both): tokenized as
    hpo trains them, so TRL's samples carry hpo's ids and labels: the call and the answer
    carry loss, the tool's result and the schemas do not."""
    from tests.configs import TOOL_CHAT

    model = _model_with(_shipped("qwen2_5"), tiny_model_dir, tmp_path / "model")
    rows = []
    for i in range(24):
        row = json.loads(json.dumps(TOOL_CHAT).replace("Paris", f"Paris {i}"))
        rows.append(row)
    data = tmp_path / "tools.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config, written = _export(model, data, tmp_path / "trl.yaml", max_length=1500)
    assert written.name == "trl.data.jsonl"
    assert "24 of 24 records with tools or tool calls" in config.read_text()

    for text, spans in _tokenized_match(model, data, config, monkeypatch):
        assert "get_weather" in spans[0] and "sunny, 21 C" in text
        assert not any("sunny, 21 C" in span or "weather of a city" in span for span in spans)


def _conversational_prompts(path: Path, count: int = 24) -> Path:
    """TRL's conversational prompt/completion: an earlier exchange in the prompt (context),
    the reply to the second question the completion."""
    rows = []
    for i in range(count):
        prompt = [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": f"What is colour {i}.0?"},
            {"role": "assistant", "content": f"It is blue {i}.0."},
            {"role": "user", "content": f"What is colour {i}.1?"},
        ]
        rows.append({"prompt": prompt, "completion": [{"role": "assistant", "content": f"It is red {i}.1."}]})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("family", ["qwen2_5", "gemma", None])
def test_conversational_prompt_completion_trains_in_trl_as_in_hpo(
    family: str | None, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL's conversational prompt/completion records: hpo puts the loss on the completion
    only (the prompt's reply is context) and exports them tokenized as it trains them; where
    TRL can render them itself (a template that takes a system message), TRL given the file
    as it is labels the same tokens too: hpo's rule is TRL's."""
    model = _model_with(family and _shipped(family), tiny_model_dir, tmp_path / "model")
    data = _conversational_prompts(tmp_path / "pc.jsonl")
    config, written = _export(model, data, tmp_path / "trl.yaml", max_length=400)
    assert written.name == "trl.data.jsonl"
    assert "conversational prompt/completion data: the records tokenized" in config.read_text()
    for text, spans in _tokenized_match(model, data, config, monkeypatch):
        assert "Answer briefly." in text and "It is blue" in text
        (span,) = spans
        assert "It is red" in span and "blue" not in span and "colour" not in span

    if family != "qwen2_5":
        return  # no template (TRL cannot render one), or one refusing a system message
    native = yaml.safe_load(config.read_text())
    native["datasets"][0]["data_files"] = str(data)
    native["completion_only_loss"] = True
    as_is = tmp_path / "as_is.yaml"
    as_is.write_text(yaml.safe_dump(native))
    _tokenized_match(model, data, as_is, monkeypatch)


def test_a_preset_without_its_model_names_the_conversations_trl_cannot_mask(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A preset carried where its model is not: nothing tells where the replies are, so the
    header counts the records that take loss on every token in TRL."""
    data = tmp_path / "chat.jsonl"
    rows = [json.loads(line) for line in _chats(tmp_path / "two.jsonl", 2, 5).read_text().splitlines()]
    rows += [json.loads(line) for line in _chats(tmp_path / "one.jsonl", 1, 7).read_text().splitlines()]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (config,) = _export(tmp_path / "elsewhere", data, tmp_path / "trl.yaml")
    text = config.read_text()
    assert "chat data takes loss on every token in TRL: 5 of 12 records" in text
    assert "tokenizer is not here" in text
    assert yaml.safe_load(text)["datasets"][0]["data_files"] == str(data.resolve())

    # Conversational prompt/completion: TRL renders it as hpo does, given the file as it is.
    prompts = _conversational_prompts(tmp_path / "pc.jsonl", 5)
    (config,) = _export(tmp_path / "elsewhere", prompts, tmp_path / "pc.yaml")
    parsed = yaml.safe_load(config.read_text())
    assert parsed["completion_only_loss"] is True
    assert parsed["datasets"][0]["data_files"] == str(prompts.resolve())


def test_the_fallback_template_renders_what_hpo_trains(tiny_model_dir: Path) -> None:
    """A tokenizer without a chat template: the written template's text and its assistant
    mask are hpo's own rendering and labels, token for token."""
    from trainers.model.lora import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_dir))
    tokenizer.chat_template = None
    template = fallback_chat_template(tokenizer)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Two plus two?"},
        {"role": "assistant", "content": "Four."},
        {"role": "user", "content": "And three?"},
        {"role": "assistant", "content": "Five."},
    ]
    from trainers.data.records import _render, special_prefix

    ((ids, labels),) = tokenize_pieces(
        [_render("messages", {"messages": messages}, tokenizer, special_prefix(tokenizer))],
        tokenizer,
    )
    rendered = tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=True, return_dict=True,
        return_assistant_tokens_mask=True,
    )  # fmt: skip
    assert rendered["input_ids"] == ids
    masked = [t if m else -100 for t, m in zip(ids, rendered["assistant_masks"], strict=True)]
    assert masked == labels
    assert tokenizer.decode(ids).startswith(tokenizer.decode(special_prefix(tokenizer)) + "<|system|>")
