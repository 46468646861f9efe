"""JSONL loading on the real tiny tokenizer: shapes and their loss masks, errors, cutting, cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from common.errors import BadInputError
from tests.configs import TOOL_CHAT
from trainers.data.dataset import (
    IGNORE_INDEX,
    DataSpec,
    Example,
    TokenizedData,
    demo_data_path,
    load_tokenized,
)
from trainers.data.make_demo_data import write_demo_data

EOS = "<|endoftext|>"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def plain_tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    """The tiny tokenizer without a chat template, so chat data uses the fallback format."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = None
    return tok


def write_jsonl(path: Path, records: list[Any]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def load(path: Path, tok: PreTrainedTokenizerBase, tmp_path: Path, **spec: Any) -> TokenizedData:
    spec.setdefault("cache_dir", str(tmp_path / "cache"))
    return load_tokenized(DataSpec(path=str(path), **spec), tok)


def everything(data: TokenizedData) -> list[Example]:
    return data.train + data.validation


def _tokens(example: Example, labelled: bool) -> list[int]:
    pairs = zip(example.input_ids, example.labels, strict=True)
    return [token for token, label in pairs if (label != IGNORE_INDEX) == labelled]


def labelled_text(tok: PreTrainedTokenizerBase, example: Example) -> str:
    return str(tok.decode(_tokens(example, labelled=True)))


def unlabelled_text(tok: PreTrainedTokenizerBase, example: Example) -> str:
    return str(tok.decode(_tokens(example, labelled=False)))


def only(data: TokenizedData, marker: str, tok: PreTrainedTokenizerBase) -> Example:
    """The one example whose text contains ``marker``."""
    found = [e for e in everything(data) if marker in tok.decode(e.input_ids)]
    assert len(found) == 1
    return found[0]


# --- the three shapes ------------------------------------------------------------------------


def test_text_is_labelled_everywhere_and_ends_with_eos(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    texts = ["Bolan lives in Tavel.", "3 plus 4 is 7.", "Counting from 2: 2 3 4 5 6."]
    data = load(
        write_jsonl(tmp_path / "t.jsonl", [{"text": t} for t in texts]), tokenizer, tmp_path
    )
    assert data.stats.shape == "text"
    for text in texts:
        example = only(data, text, tokenizer)
        assert example.labels == example.input_ids
        assert example.input_ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(example.input_ids) == text + EOS


def test_prompt_completion_labels_only_the_completion(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    records = [
        {"prompt": "Where does Bolan live?", "completion": " In Tavel."},
        {"prompt": "3 + 4 =", "completion": " 7"},
        {"prompt": "Reverse: c a t", "completion": " t a c"},
    ]
    data = load(write_jsonl(tmp_path / "pc.jsonl", records), tokenizer, tmp_path)
    assert data.stats.shape == "prompt_completion"
    for record in records:
        example = only(data, record["prompt"], tokenizer)
        n_prompt = len(tokenizer(record["prompt"], add_special_tokens=False)["input_ids"])
        assert example.labels[:n_prompt] == [IGNORE_INDEX] * n_prompt
        assert IGNORE_INDEX not in example.labels[n_prompt:]
        assert labelled_text(tokenizer, example) == record["completion"] + EOS
        assert unlabelled_text(tokenizer, example) == record["prompt"]


CHAT = {
    "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Where does Bolan live?"},
        {"role": "assistant", "content": "In Tavel."},
        {"role": "user", "content": "3 + 4 ="},
        {"role": "assistant", "content": "7"},
    ]
}
OTHER_CHAT = {
    "messages": [
        {"role": "user", "content": "Count from 2:"},
        {"role": "assistant", "content": "2 3 4 5 6"},
    ]
}


def test_chat_template_labels_only_assistant_turns(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    assert tokenizer.chat_template
    data = load(write_jsonl(tmp_path / "c.jsonl", [CHAT, OTHER_CHAT]), tokenizer, tmp_path)
    assert data.stats.shape == "messages"
    example = only(data, "Bolan", tokenizer)
    rendered = tokenizer.apply_chat_template(CHAT["messages"], tokenize=False)
    assert tokenizer.decode(example.input_ids) == rendered
    # The template's end of an assistant turn is eos + newline; both carry loss.
    assert labelled_text(tokenizer, example) == f"In Tavel.{EOS}\n7{EOS}\n"
    assert unlabelled_text(tokenizer, example) == (
        "<|system|>\nAnswer briefly.\n<|user|>\nWhere does Bolan live?\n<|assistant|>\n"
        "<|user|>\n3 + 4 =\n<|assistant|>\n"
    )


def test_chat_without_template_uses_the_fallback_format(
    plain_tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    data = load(write_jsonl(tmp_path / "c.jsonl", [CHAT, OTHER_CHAT]), plain_tokenizer, tmp_path)
    example = only(data, "Bolan", plain_tokenizer)
    assert labelled_text(plain_tokenizer, example) == f"In Tavel.{EOS}7{EOS}"
    assert plain_tokenizer.decode(example.input_ids) == (
        "<|system|>\nAnswer briefly.\n<|user|>\nWhere does Bolan live?\n"
        f"<|assistant|>\nIn Tavel.{EOS}\n<|user|>\n3 + 4 =\n<|assistant|>\n7{EOS}\n"
    )


def test_chat_template_that_is_not_prefix_stable_is_a_bad_line(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    # Its generation prompt ends in a marker that the rendering of the reply lacks (as a
    # reasoning template's opening think block): neither a prefix of the conversation nor
    # what the model is asked with is continued by its reply.
    tok.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}>>{% endif %}"
    )
    path = write_jsonl(tmp_path / "c.jsonl", [OTHER_CHAT, CHAT])
    with pytest.raises(BadInputError, match=r"c\.jsonl:1: .*prefix by prefix.*think block"):
        load(path, tok, tmp_path)
    # Appending a marker only once the conversation is complete is how some templates end
    # their last reply (Phi-3's eos): that reply is what follows the generation prompt.
    tok.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if not add_generation_prompt %}!{% endif %}"
    )
    data = load(path, tok, tmp_path)
    assert labelled_text(tok, only(data, "Count from 2", tok)) == "2 3 4 5 6!"
    assert labelled_text(tok, only(data, "Bolan", tok)) == "In Tavel.7!"


def test_a_template_that_moves_the_system_message_trains_each_reply_as_it_is_asked(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Mistral v0.3's kind of template (the system message joins the last user turn): a
    conversation is the turns before its last reply rendered with the generation prompt, as
    the model sees them when it writes that reply, then the reply; every reply carries loss,
    nothing else does. These conversations were refused as not prefix by prefix before."""
    from tests.configs import SYSTEM_IN_LAST_TURN

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = SYSTEM_IN_LAST_TURN
    one = {"messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Where does Bolan live?"},
        {"role": "assistant", "content": "In Tavel."},
    ]}  # fmt: skip
    data = load(write_jsonl(tmp_path / "c.jsonl", [CHAT, one, OTHER_CHAT]), tok, tmp_path)
    assert data.stats.records == 3 and data.stats.skipped_lines == 0
    example = only(data, "3 + 4", tok)
    asked = tok.apply_chat_template(CHAT["messages"][:-1], tokenize=False, add_generation_prompt=True)
    assert "Answer briefly." in asked  # the system message, in the last user turn
    assert tok.decode(example.input_ids) == asked + f" 7{EOS}"
    assert labelled_text(tok, example) == f" In Tavel.{EOS} 7{EOS}"
    assert "Answer briefly." in unlabelled_text(tok, example)
    (single,) = [e for e in everything(data) if "3 + 4" not in tok.decode(e.input_ids)
                 and "Bolan" in tok.decode(e.input_ids)]  # fmt: skip
    assert tok.decode(single.input_ids) == (
        tok.apply_chat_template(one["messages"][:-1], tokenize=False, add_generation_prompt=True)
        + f" In Tavel.{EOS}"
    )
    # Without a system message the template renders prefix by prefix: the usual rule.
    plain = only(data, "Count from 2", tok)
    assert tok.decode(plain.input_ids) == tok.apply_chat_template(OTHER_CHAT["messages"], tokenize=False)
    assert labelled_text(tok, plain) == f" 2 3 4 5 6{EOS}"


def _trl_templates() -> dict[str, str]:
    """The chat templates of real model families that TRL ships (not its training versions)."""
    import trl.chat_template_utils as shipped

    return {
        name.removesuffix("_chat_template"): getattr(shipped, name)
        for name in sorted(dir(shipped))
        if name.endswith("_chat_template") and "training" not in name
        and isinstance(getattr(shipped, name), str)
    }  # fmt: skip


def test_every_shipped_template_trains_each_reply_as_the_model_sees_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Over every model family's chat template TRL ships (Llama 3, Qwen 2.5-3.8, Gemma,
    Phi-3, gpt-oss, DeepSeek, Nemotron, ...), a conversation with a system message and two
    replies: it loads with the replies carrying loss and no user or system text, the sample
    being the whole rendering (prefix by prefix) or the conversation as the model sees it
    when it writes its last reply; or it is refused in one line naming the record, because
    the template cannot render it or opens a think block the reply lacks. Qwen3's, Phi-3's
    and gpt-oss's render their last reply unlike the earlier ones; they were refused before."""
    from trainers.data.records import renders_in_order

    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "It is four."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "It is six."},
    ]
    loaded, refused = [], []
    for name, template in _trl_templates().items():
        tok = AutoTokenizer.from_pretrained(tiny_model_dir)
        tok.chat_template = template
        try:
            if "2+2" not in tok.apply_chat_template(messages, tokenize=False):
                continue  # a vision model's: it renders content parts, not text
        except Exception:
            pass  # refused below, in one line
        path = write_jsonl(tmp_path / f"{name}.jsonl", [{"messages": messages}, OTHER_CHAT])
        try:
            data = load(path, tok, tmp_path, max_length=4096)  # Cohere's system preamble is long
        except BadInputError as error:
            assert str(error).startswith(f"{path}:1: ") and "\n" not in str(error), name
            assert "chat template failed" in str(error) or "think block" in str(error), name
            refused.append(name)
            continue
        example = only(data, "2+2", tok)
        text, labelled = tok.decode(example.input_ids), labelled_text(tok, example)
        assert "It is four." in labelled and "It is six." in labelled, name
        assert not any(s in labelled for s in ("Answer briefly", "2+2", "3+3")), name
        assert "Answer briefly." in text, name  # the system message is context, never lost
        turns = messages
        if name == "gemma":  # it refuses a system message: joined to the first user turn
            turns = [{"role": "user", "content": "Answer briefly.\n\nWhat is 2+2?"}, *messages[2:]]
        if renders_in_order(turns, tok):
            assert text == tok.apply_chat_template(turns, tokenize=False), name
        else:
            prompt = tok.apply_chat_template(turns[:-1], tokenize=False, add_generation_prompt=True)
            assert text.startswith(prompt) and text.endswith(labelled[-12:]), name
        loaded.append(name)
    assert {"qwen3", "phi3", "gptoss", "gemma", "llama3", "qwen2_5"} <= set(loaded)
    assert len(loaded) >= 2 * len(refused)


def test_reasoning_a_template_renders_is_trained_and_one_it_drops_is_said(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A reply's `reasoning_content` (Qwen3's field for its think block) is passed to the
    template: under Qwen3's it is rendered into the last reply and carries loss, where it was
    dropped before (a study then tuned and timed replies without their traces). From a
    Parquet file, whose rows give every message every field (None where unset), the unset
    ones are not passed. Under a template that does not render it (Llama 3's) the log says
    so, once."""
    import datasets
    import trl.chat_template_utils as shipped

    from trainers.data import records

    monkeypatch.setattr(records, "_CHECKED", set())
    rows = [
        {"messages": [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "It is four.", "reasoning_content": "Two and two make four."},
        ]},
        {"messages": [
            {"role": "user", "content": "Count from 2:"},
            {"role": "assistant", "content": "2 3 4 5 6"},
        ]},
    ]  # fmt: skip
    jsonl = write_jsonl(tmp_path / "r.jsonl", rows)
    parquet = tmp_path / "r.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = shipped.qwen3_chat_template
    for path in (jsonl, parquet):
        data = load(path, tok, tmp_path)
        example = only(data, "2+2", tok)
        assert "Two and two make four." in labelled_text(tok, example)
        assert labelled_text(tok, example).endswith("It is four.<|im_end|>\n")
        assert "None" not in tok.decode(only(data, "Count from 2", tok).input_ids)
    assert not [r for r in caplog.records if "reasoning_content" in r.getMessage()]

    tok.chat_template = shipped.llama3_chat_template
    for again in range(2):  # rendered twice (no cache between), said once
        data = load(jsonl, tok, tmp_path / f"again{again}")
        assert "Two and two" not in tok.decode(only(data, "2+2", tok).input_ids)
    said = [r for r in caplog.records if "'reasoning_content'" in r.getMessage()]
    assert len(said) == 1 and "not trained on" in said[0].getMessage()


def test_content_parts_are_read_as_their_text(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    """OpenAI-style content parts (`[{"type": "text", "text": ...}]`) train as their text,
    one line a part; any other part stops with the record's line and the part named."""
    parts = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Where does"},
                                     {"type": "text", "text": "Bolan live?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "In Tavel."}]},
    ]}  # fmt: skip
    plain = {"messages": [
        {"role": "user", "content": "Where does\nBolan live?"},
        {"role": "assistant", "content": "In Tavel."},
    ]}  # fmt: skip
    a = load(write_jsonl(tmp_path / "parts.jsonl", [parts, OTHER_CHAT]), tokenizer, tmp_path)
    b = load(write_jsonl(tmp_path / "plain.jsonl", [plain, OTHER_CHAT]), tokenizer, tmp_path)
    assert only(a, "Bolan", tokenizer) == only(b, "Bolan", tokenizer)
    image = {"messages": [
        {"role": "user", "content": [{"type": "image", "url": "x.png"}, {"type": "text", "text": "?"}]},
        {"role": "assistant", "content": "A cat."},
    ]}  # fmt: skip
    with pytest.raises(BadInputError, match=r"bad\.jsonl:2: messages\[0\]\.content\[0\] is of type 'image'"):
        load(write_jsonl(tmp_path / "bad.jsonl", [OTHER_CHAT, image]), tokenizer, tmp_path)


@pytest.mark.parametrize("family", ["llama3_1", "qwen2_5", "qwen3"])
def test_tool_calls_carry_loss_and_tool_results_do_not(
    family: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A conversation with tools: the schemas go to the template (in the prompt, no loss), a
    reply that only calls a tool carries loss on its rendered call, the tool's result is
    context. Llama 3.1's and Qwen 2.5's render it prefix by prefix, Qwen3's as at its last
    reply (its earlier call found up to its end-of-turn marker)."""
    import trl.chat_template_utils as shipped

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = getattr(shipped, f"{family}_chat_template")
    path = write_jsonl(tmp_path / "t.jsonl", [TOOL_CHAT, OTHER_CHAT])
    data = load(path, tok, tmp_path, max_length=2048)
    example = only(data, "Weather in Paris", tok)
    labelled, context = labelled_text(tok, example), unlabelled_text(tok, example)
    assert "get_weather" in labelled and '"Paris"' in labelled
    assert "It is sunny in Paris." in labelled and example.labels[-1] != IGNORE_INDEX
    assert "sunny, 21 C" in context and "The weather of a city" in context
    assert "sunny, 21 C" not in labelled and "Weather in Paris?" not in labelled


def test_tools_given_as_json_text_train_as_the_list(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`tools` as the JSON text of the list (how Hub datasets keep schemas of any shape in one
    Arrow column, and TRL reads them), from JSONL and Parquet: the same sample as the list
    gives; text that is not JSON stops with the record's line."""
    import datasets
    import trl.chat_template_utils as shipped

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = shipped.qwen2_5_chat_template
    as_text = {**TOOL_CHAT, "tools": json.dumps(TOOL_CHAT["tools"])}
    listed = load(write_jsonl(tmp_path / "l.jsonl", [TOOL_CHAT, OTHER_CHAT]), tok, tmp_path / "l", max_length=2048)
    parquet = tmp_path / "t.parquet"
    datasets.Dataset.from_list([as_text, {**OTHER_CHAT, "tools": ""}]).to_parquet(str(parquet))
    for path in (write_jsonl(tmp_path / "t.jsonl", [as_text, OTHER_CHAT]), parquet):
        data = load(path, tok, tmp_path / path.suffix, max_length=2048)
        assert only(data, "Weather in Paris", tok) == only(listed, "Weather in Paris", tok)
        assert "The weather of a city" in tok.decode(only(data, "Weather in Paris", tok).input_ids)
    with pytest.raises(BadInputError, match=r"b\.jsonl:2: field 'tools' is text but not JSON"):
        load(write_jsonl(tmp_path / "b.jsonl", [OTHER_CHAT, {**TOOL_CHAT, "tools": "[{"}]), tok, tmp_path / "b")


def test_tool_data_a_template_cannot_render_is_refused(
    tiny_model_dir: Path, plain_tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    """Llama 3's template (3.0) renders no tool calls: a calling reply would train as an
    empty answer. It, a tokenizer without a template, and malformed tool fields stop with
    the record's line."""
    import trl.chat_template_utils as shipped

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = shipped.llama3_chat_template
    path = write_jsonl(tmp_path / "t.jsonl", [OTHER_CHAT, TOOL_CHAT])
    with pytest.raises(BadInputError, match=r"t\.jsonl:2: .*does not render tool calls"):
        load(path, tok, tmp_path)
    with pytest.raises(BadInputError, match=r"t\.jsonl:2: tools and tool calls need .*chat template"):
        load(path, plain_tokenizer, tmp_path)
    bad_tools = {**TOOL_CHAT, "tools": {"name": "get_weather"}}
    no_content = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant"}]}
    for record, message in [
        (bad_tools, r"field 'tools' must be a list of objects, got object"),
        (no_content, r"messages\[1\]\.content must be a string, got nothing"),
    ]:
        with pytest.raises(BadInputError, match=rf"b\.jsonl:1: {message}"):
            load(write_jsonl(tmp_path / "b.jsonl", [record]), tok, tmp_path)


@pytest.mark.parametrize("family", [None, "qwen2_5", "qwen3"])
def test_conversational_prompt_completion_labels_the_completion_only(
    family: str | None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """TRL's conversational prompt/completion (from JSONL or Parquet): with one reply it
    trains as the same `messages` record does; a reply inside the prompt is context. A
    completion without a reply, or a prompt that is neither text nor messages, is refused
    with the record's line."""
    import datasets
    import trl.chat_template_utils as shipped

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    if family:
        tok.chat_template = getattr(shipped, f"{family}_chat_template")
    first = [{"role": "user", "content": "Where does Bolan live?"}]
    reply = [{"role": "assistant", "content": "In Tavel."}]
    earlier = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}]
    other = {"prompt": [{"role": "user", "content": "2+2?"}], "completion": [{"role": "assistant", "content": "4"}]}
    rows = [{"prompt": first, "completion": reply}, {"prompt": earlier + first, "completion": reply}, other]
    jsonl = write_jsonl(tmp_path / "pc.jsonl", rows)
    parquet = tmp_path / "pc.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    # Qwen 2.5's template adds its own system message: room for it.
    messages = load(write_jsonl(tmp_path / "m.jsonl", [{"messages": first + reply}, OTHER_CHAT]), tok, tmp_path / "m", max_length=512)
    as_messages = only(messages, "Bolan", tok)
    for path in (jsonl, parquet):
        data = load(path, tok, tmp_path / path.suffix, max_length=512)
        (alone,) = [e for e in everything(data) if "Bolan" in tok.decode(e.input_ids) and "Hi" not in tok.decode(e.input_ids)]
        assert (alone.input_ids, alone.labels) == (as_messages.input_ids, as_messages.labels)
        after = only(data, "Hello there.", tok)
        assert "Hello there." in unlabelled_text(tok, after)
        assert "In Tavel." in labelled_text(tok, after) and "Hello" not in labelled_text(tok, after)

    for record, message in [
        ({"prompt": first, "completion": first}, r"no assistant message in 'completion'"),
        ({"prompt": "Where?", "completion": reply}, r"field 'prompt' must be a non-empty list, got string"),
        ({"prompt": first, "completion": []}, r"field 'completion' must be a non-empty list"),
    ]:
        with pytest.raises(BadInputError, match=rf"b\.jsonl:2: {message}"):
            load(write_jsonl(tmp_path / "b.jsonl", [other, record]), tok, tmp_path / "b")


def test_columnar_tool_data_trains_no_keys_other_rows_set(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Arrow gives every row of a column one struct type: in a Parquet file or a saved
    dataset, one record's call get_weather(city) came back with another's `tz: None`, and its
    tool schema with the other's properties. Those keys are not rendered: each record trains
    as its JSONL line does, while a JSONL line's written null argument stays."""
    import copy

    import datasets
    import trl.chat_template_utils as shipped

    clock = copy.deepcopy(TOOL_CHAT)
    clock["tools"] = [{"type": "function", "function": {
        "name": "get_time", "description": "The time in a zone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
                       "required": ["tz"]},
    }}]  # fmt: skip
    clock["messages"][0]["content"] = "Time in Oslo?"
    clock["messages"][1]["tool_calls"][0]["function"] = {"name": "get_time", "arguments": {"tz": "CET"}}
    rows = [TOOL_CHAT, clock]
    parquet, saved = tmp_path / "t.parquet", tmp_path / "saved"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = shipped.qwen2_5_chat_template
    as_written = load(write_jsonl(tmp_path / "t.jsonl", rows), tok, tmp_path / "j", max_length=2048)
    for path in (parquet, saved):
        data = load(path, tok, tmp_path / path.stem, max_length=2048)
        for marker in ("Weather in Paris", "Time in Oslo"):
            example = only(data, marker, tok)
            assert "null" not in tok.decode(example.input_ids)
            written = only(as_written, marker, tok)
            assert (example.input_ids, example.labels) == (written.input_ids, written.labels)
    assert '"tz": "CET"' in labelled_text(tok, only(as_written, "Time in Oslo", tok))

    explicit = copy.deepcopy(TOOL_CHAT)
    explicit["messages"][1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris", "unit": None}
    data = load(write_jsonl(tmp_path / "n.jsonl", [explicit, clock]), tok, tmp_path / "n", max_length=2048)
    assert '"unit": null' in labelled_text(tok, only(data, "Weather in Paris", tok))


def test_chat_template_kwargs_reach_the_template(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A record's `chat_template_kwargs` (TRL's column) go to the template, as TRL passes
    them: under Qwen3's, `enable_thinking: false` puts the empty think block in the prompt, so
    the reply alone carries loss; Nemotron 3's, refused without it (its generation prompt
    opens a think block the reply lacks), trains with it. A Parquet row another row's names
    were given as None trains as its JSONL line. A name the template never reads is said
    once; malformed or reserved ones, or ones on a record no template renders, stop with the
    record's line."""
    import inspect

    import datasets
    import trl.chat_template_utils as shipped
    from transformers import PreTrainedTokenizerBase as Base

    from trainers.data import records

    monkeypatch.setattr(records, "_CHECKED", set())
    chat = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "It is four."}]
    off = {"messages": chat, "chat_template_kwargs": {"enable_thinking": False}}
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = shipped.qwen3_chat_template
    data = load(write_jsonl(tmp_path / "q.jsonl", [off, OTHER_CHAT]), tok, tmp_path / "q")
    example = only(data, "2+2", tok)
    assert labelled_text(tok, example) == "It is four.<|im_end|>\n"
    assert unlabelled_text(tok, example).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    data = load(write_jsonl(tmp_path / "d.jsonl", [{"messages": chat}, OTHER_CHAT]), tok, tmp_path / "d")
    assert labelled_text(tok, only(data, "2+2", tok)).startswith("<think>")  # the default

    tok.chat_template = shipped.nemotron_3_nano_chat_template
    two = chat + [{"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "It is six."}]
    with pytest.raises(BadInputError, match=r"n\.jsonl:1: .*think block.*enable_thinking"):
        load(write_jsonl(tmp_path / "n.jsonl", [{"messages": two}]), tok, tmp_path / "n")
    data = load(
        write_jsonl(tmp_path / "n.jsonl", [{**off, "messages": two}, {**OTHER_CHAT, "chat_template_kwargs": {"enable_thinking": False}}]),
        tok, tmp_path / "n", max_length=1024,
    )  # fmt: skip
    example = only(data, "2+2", tok)
    assert labelled_text(tok, example) == "It is four.<|im_end|>\nIt is six.<|im_end|>\n"
    assert "3+3" in unlabelled_text(tok, example)

    # gpt-oss reads `reasoning_effort` into its system prompt ("medium" when unset).
    tok.chat_template = shipped.gptoss_chat_template
    rows = [{"messages": chat, "chat_template_kwargs": {"reasoning_effort": "low"}},
            {"messages": OTHER_CHAT["messages"], "chat_template_kwargs": {"enable_thinking": False}}]  # fmt: skip
    parquet = tmp_path / "r.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    for path in (write_jsonl(tmp_path / "r.jsonl", rows), parquet):
        data = load(path, tok, tmp_path / path.suffix, max_length=1024)
        assert "Reasoning: low" in tok.decode(only(data, "2+2", tok).input_ids)
        other = tok.decode(only(data, "Count from 2", tok).input_ids)
        assert "Reasoning: medium" in other and "None" not in other
    said = [r.getMessage() for r in caplog.records if "chat_template_kwargs" in r.getMessage()]
    assert len(said) == 1 and "'enable_thinking'" in said[0] and "does not read" in said[0]

    for record, message in [
        ({**off, "chat_template_kwargs": ["enable_thinking"]}, r"field 'chat_template_kwargs' must be an object, got array"),
        ({**off, "chat_template_kwargs": {"tools": [], "add_generation_prompt": True}},
         r"chat_template_kwargs may not set 'add_generation_prompt', 'tools'"),
        ({"text": "Hi", "chat_template_kwargs": {"enable_thinking": False}},
         r"field 'chat_template_kwargs' in a text record"),
        ({"prompt": "Hi", "completion": " there", "chat_template_kwargs": {"enable_thinking": False}},
         r"field 'chat_template_kwargs' in a text prompt/completion record"),
    ]:  # fmt: skip
        with pytest.raises(BadInputError, match=rf"b\.jsonl:2: {message}"):
            load(write_jsonl(tmp_path / "b.jsonl", [OTHER_CHAT, record]), tok, tmp_path / "b")
    # Every parameter of apply_chat_template is one a record cannot set.
    parameters = set(inspect.signature(Base.apply_chat_template).parameters) - {"self", "kwargs"}
    assert parameters <= records.RESERVED_TEMPLATE_KWARGS


@pytest.mark.parametrize("family", ["deepseek_r1_distill", "qwen3", "nemotron_3_nano"])
def test_reasoning_written_in_the_content_trains(
    family: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Replies whose content writes their reasoning (`<think>...</think>answer`, as distilled
    reasoning data does), two of them: the last is trained as the model writes it after its
    generation prompt, trace and answer; the earlier one as the history holds it, its
    answer (these templates drop an earlier trace). DeepSeek-R1's template drops the trace
    from every reply and opens the think block in its generation prompt; it and the others
    refused such a conversation before."""
    import trl.chat_template_utils as shipped

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = getattr(shipped, f"{family}_chat_template")
    messages = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\nIt is four."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<think>\nThree and three.\n</think>\n\nIt is six."},
    ]
    other = {"messages": [messages[0], {"role": "assistant", "content": "<think>\nSum.\n</think>\n\n4"}]}
    data = load(write_jsonl(tmp_path / "r.jsonl", [{"messages": messages}, other]), tok, tmp_path, max_length=1024)
    example = only(data, "3+3", tok)
    text, labelled = tok.decode(example.input_ids), labelled_text(tok, example)
    prompt = tok.apply_chat_template(messages[:3], tokenize=False, add_generation_prompt=True)
    assert text.startswith(prompt.removeprefix(EOS)) or text.startswith(prompt)
    assert "Three and three.\n</think>" in labelled and labelled.rstrip().endswith(
        tok.apply_chat_template(messages, tokenize=False).rstrip()[-12:]
    )
    assert "It is four." in labelled and "Two and two" not in text  # the history's form
    assert not any(s in labelled for s in ("2+2", "3+3"))
    # A template whose generation prompt closes an empty block (Qwen3.5's no-think) has no
    # place for a trace: refused, not trained as a second close after the empty one.
    tok.chat_template = shipped.qwen3_5_nothink_chat_template
    with pytest.raises(BadInputError, match=r"n\.jsonl:1: .*think block"):
        load(write_jsonl(tmp_path / "n.jsonl", [{"messages": messages}]), tok, tmp_path / "n")
    tok.chat_template = getattr(shipped, f"{family}_chat_template")
    if family == "deepseek_r1_distill":  # a reply without its trace after an opened <think>
        plain = {"messages": [messages[0], {"role": "assistant", "content": "It is four."}]}
        with pytest.raises(BadInputError, match=r"p\.jsonl:1: .*starts with <think>"):
            load(write_jsonl(tmp_path / "p.jsonl", [plain]), tok, tmp_path / "p")


def test_tokenizer_that_adds_bos_keeps_it_unlabelled(tiny_model_dir: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    backend = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    bos_id = backend.token_to_id("<|system|>")  # any special token will do as a bos here
    backend.post_processor = TemplateProcessing(
        single="<|system|> $A", special_tokens=[("<|system|>", bos_id)]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|system|>", eos_token=EOS)
    records = [{"prompt": "3 + 4 =", "completion": " 7"}, {"prompt": "1 + 1 =", "completion": " 2"}]
    data = load(write_jsonl(tmp_path / "pc.jsonl", records), tok, tmp_path)
    for example in everything(data):
        assert example.input_ids[0] == bos_id
        assert example.input_ids.count(bos_id) == 1
        assert example.labels[0] == IGNORE_INDEX
    assert labelled_text(tok, only(data, "3 + 4", tok)) == f" 7{EOS}"


@pytest.mark.parametrize("shape", ["text", "prompt_completion", "messages"])
def test_demo_data_loads_cleanly(
    shape: str, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    data = load(demo_data_path(shape), tokenizer, tmp_path, max_length=64)
    assert data.stats.shape == shape
    assert data.stats.samples == 3000
    assert data.stats.skipped_lines == 0
    assert data.stats.truncated == 0
    assert json.loads(json.dumps(data.stats.to_dict()))["samples"] == 3000


def test_shipped_demo_data_matches_its_generator(tmp_path: Path) -> None:
    for written in write_demo_data(tmp_path):
        assert written.read_bytes() == (demo_data_path().parent / written.name).read_bytes()


def test_label_noise_answers_some_facts_and_sums_at_random_and_nothing_else(
    tmp_path: Path,
) -> None:
    """Same questions, in the same order; only fact and sum answers change, about as often as
    asked (0.3 of the 60 % of records that are facts or sums, less the draws that land on
    the right answer), while reversals and counting stay exact."""
    exact = [json.loads(x) for x in demo_data_path().read_text().splitlines()]
    write_demo_data(tmp_path, label_noise=0.3)
    noisy = [json.loads(x) for x in (tmp_path / demo_data_path().name).read_text().splitlines()]
    assert [r["prompt"] for r in noisy] == [r["prompt"] for r in exact]
    changed = [(e, n) for e, n in zip(exact, noisy, strict=True) if e != n]
    assert 0.10 < len(changed) / len(exact) < 0.25
    assert all(not e["prompt"].startswith(("Reverse", "Count")) for e, _ in changed)
    sums = [n for e, n in changed if "+" in e["prompt"]]
    assert sums and all(n["completion"].strip().isdigit() for n in sums)
    with pytest.raises(ValueError, match="label_noise must lie in"):
        write_demo_data(tmp_path, label_noise=1.5)


# --- malformed input ------------------------------------------------------------------------

GOOD = {"prompt": "1 + 1 =", "completion": " 2"}


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"prompt": "1 + 1 =", "completion": " 2"', "not valid JSON"),
        ('["prompt", "completion"]', "expected a JSON object, got array"),
        ('"just a string"', "expected a JSON object, got string"),
        ('{"prompt": "1 + 1 ="}', "missing field 'completion'"),
        (
            '{"prompt": "1 + 1 =", "completion": 2}',
            "field 'completion' must be a string, got number",
        ),
        ('{"input": "x", "output": "y"}', "missing field 'instruction'"),  # an Alpaca row
        ('{"question": "x", "answer": "y"}', "no 'text', 'prompt'/'completion', 'messages'"),
        ('{"text": "a text record"}', "a text record in a prompt_completion file"),
        ('{"messages": []}', "field 'messages' must be a non-empty list"),
        ('{"messages": "hi"}', "field 'messages' must be a non-empty list, got string"),
        ('{"messages": [{"role": "bot", "content": "hi"}]}', "messages[0] has unknown role 'bot'"),
        (
            '{"messages": [{"role": "user", "content": null}]}',
            "messages[0].content must be a string",
        ),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant message"),
        ('{"messages": [{"role": "assistant", "content": "hi"}]}', "messages[0] is an assistant"),
    ],
)
def test_malformed_line_names_file_and_line(
    bad_line: str, message: str, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    # Lines: 1 good, 2 blank (ignored but counted), 3 good, 4 bad, 5 good.
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, "", GOOD, bad_line, GOOD])
    with pytest.raises(BadInputError) as caught:
        load(path, tokenizer, tmp_path)
    assert str(caught.value).startswith(f"{path}:4: ")
    assert message in str(caught.value)


def test_bad_messages_in_a_chat_file(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [CHAT, {"prompt": "p", "completion": "c"}])
    with pytest.raises(
        BadInputError, match=r"c\.jsonl:2: a prompt_completion record in a messages"
    ):
        load(path, tokenizer, tmp_path)


def test_invalid_utf8_is_a_bad_line(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b'\n{"text": "\xff"}\n')
    with pytest.raises(BadInputError, match=r"d\.jsonl:2: not valid UTF-8"):
        load(path, tokenizer, tmp_path)


def test_skip_bad_lines_counts_them(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    bad = ["{oops", '{"prompt": 1, "completion": "x"}', "[]", '{"text": "other shape"}']
    good = [{"prompt": f"{i} + 1 =", "completion": f" {i + 1}"} for i in range(6)]
    path = write_jsonl(
        tmp_path / "d.jsonl", [bad[0], *good[:3], bad[1], "", bad[2], *good[3:], bad[3]]
    )
    data = load(path, tokenizer, tmp_path, skip_bad_lines=True)
    assert data.stats.skipped_lines == 4
    assert data.stats.samples == 6
    # The same file without skipping still fails, although its skipping load is cached.
    with pytest.raises(BadInputError, match=r"d\.jsonl:1: not valid JSON"):
        load(path, tokenizer, tmp_path)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file_is_an_error(
    content: str, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(BadInputError, match=r"empty\.jsonl: no usable records"):
        load(path, tokenizer, tmp_path)


def test_only_bad_lines_under_skip_is_an_error(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", ["{", "[]"])
    with pytest.raises(BadInputError, match=r"no usable records \(2 bad line\(s\) skipped\)"):
        load(path, tokenizer, tmp_path, skip_bad_lines=True)


def test_missing_file_names_the_path(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "data.jsonl"
    with pytest.raises(BadInputError, match=f"data file not found: {path}"):
        load(path, tokenizer, tmp_path)


def test_one_sample_cannot_be_split(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="need at least 2"):
        load(write_jsonl(tmp_path / "one.jsonl", [GOOD]), tokenizer, tmp_path)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("overflow", "wrap"),
        ("max_length", 1),
        ("max_length", 12.5),
        ("validation_fraction", 0.0),
        ("validation_fraction", 1.0),
        ("skip_bad_lines", "yes"),
        ("seed", None),
    ],
)
def test_data_spec_rejects_bad_values(field: str, value: Any) -> None:
    with pytest.raises(BadInputError, match=rf"data\.{field} .*{field}={value!r}"):
        DataSpec(path="x.jsonl", **{field: value})


# --- cutting: truncation and packing ----------------------------------------------------------


def _texts(n: int) -> list[dict[str, str]]:
    return [{"text": " ".join(["3 plus 4 is 7."] * (1 + i % 4))} for i in range(n)]


def test_truncation_cuts_and_counts(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", _texts(20))
    full = load(path, tokenizer, tmp_path, max_length=512)
    cut = load(path, tokenizer, tmp_path, max_length=12)
    full_lengths = [len(e.input_ids) for e in everything(full)]
    assert full.stats.truncated == 0
    assert cut.stats.truncated == sum(n > 12 for n in full_lengths) > 0
    assert cut.stats.tokens_max == 12
    assert cut.stats.lengths == [min(n, 12) for n in full_lengths]
    for whole, part in zip(everything(full), everything(cut), strict=True):
        assert part.input_ids == whole.input_ids[:12]
        assert part.labels == whole.labels[:12]


def test_packing_fills_blocks_per_split(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", _texts(30))
    whole = load(path, tokenizer, tmp_path, max_length=512)
    packed = load(path, tokenizer, tmp_path, max_length=16, overflow="pack")
    assert packed.stats.truncated == 0
    assert packed.stats.total_tokens == whole.stats.total_tokens
    assert packed.stats.samples == len(packed.train) + len(packed.validation)
    for split_whole, split_packed in [
        (whole.train, packed.train),
        (whole.validation, packed.validation),
    ]:
        assert all(len(e.input_ids) == 16 for e in split_packed[:-1])
        assert 0 < len(split_packed[-1].input_ids) <= 16
        stream = [t for e in split_whole for t in e.input_ids]
        assert [t for e in split_packed for t in e.input_ids] == stream
        labels = [t for e in split_whole for t in e.labels]
        assert [t for e in split_packed for t in e.labels] == labels


# --- cache and split -------------------------------------------------------------------------


def test_cache_is_reused_and_keyed(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "pc.jsonl", [GOOD, {"prompt": "2 + 2 =", "completion": " 4"}] * 5)
    first = load(path, tokenizer, tmp_path)
    second = load(path, tokenizer, tmp_path)
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert second.cache_path == first.cache_path and Path(first.cache_path).is_file()
    assert second.train == first.train and second.validation == first.validation
    assert second.stats == first.stats
    # The samples whole, which no sample outgrows at 128 tokens; no temp files left.
    assert list((tmp_path / "cache").iterdir()) == [Path(first.cache_path)]

    # One tokenization serves every cut (a study's profiles, its validation length): each
    # length and overflow is cut from the cache as a fresh load would cut it.
    for cut in ({"max_length": 4}, {"overflow": "pack", "max_length": 16}):
        from_cache, fresh = load(path, tokenizer, tmp_path, **cut), load(path, tokenizer, tmp_path / "fresh", **cut)
        assert from_cache.cache_hit and not fresh.cache_hit
        assert (from_cache.train, from_cache.validation) == (fresh.train, fresh.validation)
        assert from_cache.stats == fresh.stats and max(from_cache.stats.lengths) <= cut["max_length"]
        shutil.rmtree(tmp_path / "fresh")
    cut_at_4 = load(path, tokenizer, tmp_path, max_length=4)
    assert cut_at_4.stats.truncated == 10 and cut_at_4.cache_path.endswith("-4.npz")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(
        [Path(first.cache_path).name, Path(cut_at_4.cache_path).name]
    )  # the whole samples and the one length that cuts them
    assert load(path, tokenizer, tmp_path, seed=5).cache_hit  # the split is made after the cache
    assert not load(path, tokenizer, tmp_path, skip_bad_lines=True).cache_hit
    write_jsonl(path, [GOOD, {"prompt": "2 + 2 =", "completion": " 5"}] * 5)
    assert not load(path, tokenizer, tmp_path).cache_hit


def test_cache_depends_on_the_chat_template(
    tokenizer: PreTrainedTokenizerBase,
    plain_tokenizer: PreTrainedTokenizerBase,
    tmp_path: Path,
) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [CHAT, OTHER_CHAT])
    with_template = load(path, tokenizer, tmp_path)
    without = load(path, plain_tokenizer, tmp_path)
    assert not without.cache_hit
    assert with_template.cache_path != without.cache_path


def test_unreadable_cache_is_rebuilt(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    """A cut file that cannot be read is cut again from the whole samples; with those
    unreadable too, the data is tokenized again."""
    path = write_jsonl(tmp_path / "pc.jsonl", [GOOD] * 4)
    first = load(path, tokenizer, tmp_path, max_length=4)
    assert first.cache_path.endswith("-4.npz")
    Path(first.cache_path).write_bytes(b"not a zip file")
    again = load(path, tokenizer, tmp_path, max_length=4)
    assert again.cache_hit and again.train == first.train
    for written in (tmp_path / "cache").iterdir():
        written.write_bytes(b"not a zip file")
    again = load(path, tokenizer, tmp_path, max_length=4)
    assert not again.cache_hit
    assert again.train == first.train
    assert load(path, tokenizer, tmp_path, max_length=4).cache_hit


def test_split_is_deterministic_by_seed(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    records = [{"prompt": f"{i} + 1 =", "completion": f" {i + 1}"} for i in range(40)]
    path = write_jsonl(tmp_path / "pc.jsonl", records)

    def validation_prompts(seed: int, fraction: float = 0.1) -> list[str]:
        data = load(path, tokenizer, tmp_path, seed=seed, validation_fraction=fraction)
        assert len(data.train) + len(data.validation) == 40
        return [unlabelled_text(tokenizer, e) for e in data.validation]

    assert validation_prompts(1) == validation_prompts(1)
    assert validation_prompts(1) != validation_prompts(2)
    assert len(validation_prompts(1)) == 4
    assert len(validation_prompts(1, fraction=0.001)) == 1
    assert len(validation_prompts(1, fraction=0.999)) == 39
