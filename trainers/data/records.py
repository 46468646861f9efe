"""Records -> validated, labelled token ids (the record shapes and chat rendering).

Five shapes, one per file: ``text``, ``prompt``/``completion``, ``messages`` and two layouts
that LLaMA-Factory and axolotl document, mapped to ``messages``: Alpaca (``instruction``,
optional ``input`` and ``system``, ``output``) and ShareGPT (``conversations`` of
``{"from": human|gpt|system, "value": ...}``, optional top-level ``system``).

Each good record is rendered into *pieces*: text (or token ids) with a flag saying whether its
tokens carry loss. Tokenizing piece by piece keeps the loss mask exact: no offset mapping, and
a prompt's last token can never merge with a completion's first. For byte-level BPE this gives
the same tokens as the whole text; a SentencePiece-style tokenizer that prepends a space marker
on every call adds one to a piece that starts without a space (completions conventionally start
with one).

Without a chat template, every message becomes ``<|{role}|>\n{content}\n`` with eos right after
an assistant's content; only that content and its eos carry loss. With
``tokenizer.chat_template`` set, an assistant turn is what rendering it adds to the rendering
of the messages before it with the generation prompt (so a template's end-of-turn marker
carries loss too). A template that renders a conversation otherwise once its last reply is in
(Mistral-Instruct v0.3's moves the system message into the last user turn, and drops it when a
reply is last; Qwen3's gives the last reply an empty think block) gets the turns before the
last reply rendered with the generation prompt, then that reply: what the model sees when it
writes it, every reply labelled. A message's other fields (`reasoning_content`, `tool_calls`),
a record's `tools` and its `chat_template_kwargs` (TRL's column: `enable_thinking`, ...) go to
the template; `tool` messages are context. A conversational
``prompt``/``completion`` record (TRL's: two lists of messages) is labelled as TRL labels it:
the whole conversation rendered, the loss on what follows its common beginning with the prompt
rendered with the generation prompt (without a template, the completion's replies).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import BadInputError
from trainers.data.sources import BadRecord, DataSource, open_source, records

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SHAPES = ("text", "prompt_completion", "messages", "alpaca", "sharegpt")
ROLES = ("system", "user", "assistant", "tool")
# ShareGPT speakers -> chat roles (the names LLaMA-Factory's and axolotl's docs use).
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "function_call": "assistant", "observation": "tool"}
IGNORE_INDEX = -100

# A piece of a rendered sample: text to tokenize (or token ids as they are) and whether its
# tokens carry loss.
Piece = tuple[str | list[int], bool]


_BadLine = BadRecord


def read_native(
    data: str | Path | DataSource, *, skip_bad_lines: bool = False
) -> tuple[str, list[dict[str, Any]], int]:
    """Read and validate every record, Alpaca and ShareGPT mapped to ``messages``.

    Args:
        data: A data path (see ``trainers.data.sources``) or an opened source.
        skip_bad_lines: Count malformed records instead of raising.

    Returns:
        The file's record shape (as found: ``alpaca`` stays ``alpaca``), the good records in
        their native shape (``text``, ``prompt``/``completion`` or ``messages``) and the number
        of skipped records.

    Raises:
        BadInputError: ``path:line: what`` (JSONL) or ``path: row N: what`` for a malformed
            record (unless skipped), or no good record at all.
    """
    source = data if isinstance(data, DataSource) else open_source(data)
    shape: str | None = None
    native: list[dict[str, Any]] = []
    skipped = 0
    for number, record in records(source):
        try:
            if isinstance(record, BadRecord):
                raise record
            record_shape = _validate(record)
            if shape is not None and record_shape != shape:
                raise _BadLine(f"a {record_shape} record in a {shape} file (one shape per file)")
            native.append(to_native(record_shape, record))
            shape = record_shape
        except BadRecord as bad:
            if not skip_bad_lines:
                why = _absent_column(record, source.columns, str(bad)) or bad
                raise BadInputError(f"{source.location(number)}: {why}") from None
            skipped += 1
    if shape is None:
        raise BadInputError(f"{source.path}: no usable records ({skipped} bad line(s) skipped)")
    return shape, native, skipped


def _absent_column(record: Any, columns: tuple[tuple[str, str], ...], why: str) -> str | None:
    """Why a record read through `data_columns` failed (`why`), where the field it names was
    to come from a column the record lacks: a typo in the mapping, which the record's own
    check sees only as hpo's field missing. None where no such column is at fault."""
    if not isinstance(record, dict):
        return None
    missing = [(f, c) for f, c in columns if f not in record and repr(f) in why]
    if not missing:
        return None
    # The renamed record's keys as the data names them (a field read from a column: that column).
    names = dict(columns)
    had = ", ".join(names.get(str(key), str(key)) for key in record) or "none"
    field, column = missing[0]
    return f"no column {column!r} (--data-columns {field}={column}); the record's columns: {had}"


def read_pieces(
    data: str | Path | DataSource,
    tokenizer: PreTrainedTokenizerBase,
    *,
    skip_bad_lines: bool = False,
) -> tuple[str, list[list[Piece]], int]:
    """Read and validate a data set and render every record into labelled pieces.

    Args:
        data: A data path or an opened source (see ``read_native``).
        tokenizer: Renders chat records (template, special tokens).
        skip_bad_lines: Count malformed records instead of raising.

    Returns:
        The file's record shape, the pieces of each good record, and the number of skipped
        records.

    Raises:
        BadInputError: As ``read_native``; a conversation the chat template cannot render is
            named by its record number too.
    """
    source = data if isinstance(data, DataSource) else open_source(data)
    shape, native, skipped = read_native(source, skip_bad_lines=skip_bad_lines)
    prefix = special_prefix(tokenizer)
    rendered: list[list[Piece]] = []
    for index, record in enumerate(native):
        try:
            rendered.append(render_native(record, tokenizer, prefix))
        except BadRecord as bad:
            if not skip_bad_lines:
                raise BadInputError(f"{source.location(index + 1)}: {bad}") from None
            skipped += 1
    if not rendered:
        raise BadInputError(f"{source.path}: no usable records ({skipped} bad line(s) skipped)")
    return shape, rendered, skipped


def to_native(shape: str, record: dict[str, Any]) -> dict[str, Any]:
    """A valid record in a shape TRL and this project's renderer read directly (a chat
    record keeps its `tools` and `chat_template_kwargs`)."""
    native = _to_native(shape, record)
    if kwargs := record.get("chat_template_kwargs"):
        native["chat_template_kwargs"] = dict(kwargs)
    return native


def _to_native(shape: str, record: dict[str, Any]) -> dict[str, Any]:
    if shape == "alpaca":
        prompt = record["instruction"]
        if record.get("input"):
            prompt = f"{prompt}\n\n{record['input']}"
        messages = [{"role": "system", "content": record["system"]}] if record.get("system") else []
        messages += [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": record["output"]},
        ]
        return {"messages": messages}
    if shape == "sharegpt":
        turns = [
            {"role": "assistant", "content": "", "tool_calls": _sharegpt_calls(turn["value"])}
            if turn["from"] == "function_call"
            else {"role": SHAREGPT_ROLES[turn["from"]], "content": turn["value"]}
            for turn in record["conversations"]
        ]
        if record.get("system"):
            turns.insert(0, {"role": "system", "content": record["system"]})
        schemas = _sharegpt_tools(record.get("tools"))
        return {"messages": turns, **({"tools": schemas} if schemas else {})}
    schemas = _tools(record)
    tools = {"tools": schemas} if schemas else {}
    if shape == "messages":
        return {"messages": [_message(m) for m in record["messages"]], **tools}
    if shape == "prompt_completion":
        if isinstance(record["prompt"], list):  # conversational (TRL's shape of it)
            return {
                "prompt": [_message(m) for m in record["prompt"]],
                "completion": [_message(m) for m in record["completion"]],
                **tools,
            }
        return {"prompt": record["prompt"], "completion": record["completion"]}
    return {"text": record["text"]}


def render_native(
    record: dict[str, Any], tokenizer: PreTrainedTokenizerBase, prefix: list[int]
) -> list[Piece]:
    """One native record's labelled pieces, as the trainer renders it.

    Args:
        record: A record as ``read_native`` returns it.
        tokenizer: Renders chat records (template, special tokens).
        prefix: ``special_prefix(tokenizer)``, computed once per data set.

    Raises:
        BadRecord: The chat template cannot render the conversation, or its assistant turns
            cannot be located in the rendering.
    """
    return _render(_native_shape(record), record, tokenizer, prefix)


def _message(message: dict[str, Any]) -> dict[str, Any]:
    """A message's role and content (text parts joined), and the other fields it sets
    (`reasoning_content`, `thinking`, ...: a chat template may render them; None is a field a
    Parquet or `datasets` row leaves unset)."""
    extra = {k: v for k, v in message.items() if k not in ("role", "content") and v is not None}
    content = message.get("content")
    if isinstance(content, list):  # validated text parts
        content = _text_parts(content, "content")
    # A reply that only calls tools: templates read its content as text (some `| trim` it).
    return {"role": message["role"], "content": content or "", **extra}


def _native_shape(record: dict[str, Any]) -> str:
    return "messages" if "messages" in record else "prompt_completion" if "prompt" in record else "text"


def _validate(record: Any) -> str:
    """Check one parsed record and return its shape; raises _BadLine."""
    if not isinstance(record, dict):
        raise _BadLine(f"expected a JSON object, got {_json_type(record)}")
    if "messages" in record:
        _validate_messages(record["messages"])
        _validate_tools(record)
        _validate_template_kwargs(record)
        return "messages"
    if "conversations" in record:
        _validate_sharegpt(record)
        _validate_template_kwargs(record)
        return "sharegpt"
    if "instruction" in record or "output" in record:
        for field in ("instruction", "output"):
            if not _require_str(record, field):
                raise _BadLine(f"field {field!r} is empty")
        for field in ("input", "system"):
            if record.get(field) is not None:
                _require_str(record, field)
        _validate_template_kwargs(record)
        return "alpaca"
    if "prompt" in record or "completion" in record:
        if isinstance(record.get("prompt"), list) or isinstance(record.get("completion"), list):
            _validate_conversational_prompt(record)
            _validate_template_kwargs(record)
        else:
            for field in ("prompt", "completion"):
                _require_str(record, field)
            _no_template_kwargs(record, "a text prompt/completion")
        return "prompt_completion"
    if "text" in record:
        if not _require_str(record, "text"):
            raise _BadLine("field 'text' is empty")
        _no_template_kwargs(record, "a text")
        return "text"
    names = sorted(map(str, record))
    shown = ", ".join(map(repr, names[:8])) + (", ..." if len(names) > 8 else "")
    raise _BadLine(
        "no 'text', 'prompt'/'completion', 'messages', 'instruction'/'output' (Alpaca) or "
        f"'conversations' (ShareGPT) field, only {shown or 'none'} (--data-columns "
        "FIELD=COLUMN reads your columns as these fields)"
    )


def _validate_conversational_prompt(record: dict[str, Any]) -> None:
    """TRL's conversational prompt/completion: both lists of messages, the completion's with
    an assistant reply."""
    for field in ("prompt", "completion"):
        _validate_turns(
            record.get(field), field, ("role", "content"), ROLES, "system, user, assistant or tool"
        )
    if not any(message["role"] == "assistant" for message in record["completion"]):
        raise _BadLine("no assistant message in 'completion' (nothing to learn from)")
    _validate_tools(record)


def _validate_tools(record: dict[str, Any]) -> None:
    """A chat record's optional `tools`: a list of objects (JSON schemas), or the JSON text of
    one, as Hub datasets store them and TRL reads them."""
    _tools(record)


def _tools(record: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A chat record's `tools` as a list of objects; JSON text parsed; None or "" unset."""
    tools = record.get("tools")
    if tools is None or tools == "":
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as error:
            raise _BadLine(f"field 'tools' is text but not JSON: {error}") from None
    if not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise _BadLine(f"field 'tools' must be a list of objects, got {_json_type(tools)}")
    return tools


# apply_chat_template's own parameters, and the names it gives the template itself: a
# record's `chat_template_kwargs` cannot set them (its tools are its `tools` field; what is
# rendered with a generation prompt, and what carries loss, is the renderer's to choose).
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "conversations", "messages", "tools", "documents", "chat_template",
    "add_generation_prompt", "continue_final_message", "tokenize", "sanitize_control_tokens",
    "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs",
})  # fmt: skip


def _validate_template_kwargs(record: dict[str, Any]) -> None:
    """A chat record's optional `chat_template_kwargs` (TRL's column: variables its chat
    template reads, such as Qwen3's `enable_thinking` or gpt-oss's `reasoning_effort`): an
    object of names the renderer does not set itself."""
    kwargs = record.get("chat_template_kwargs")
    if kwargs is None:
        return
    if not isinstance(kwargs, dict):
        raise _BadLine(f"field 'chat_template_kwargs' must be an object, got {_json_type(kwargs)}")
    if reserved := sorted(set(kwargs) & RESERVED_TEMPLATE_KWARGS):
        raise _BadLine(
            f"chat_template_kwargs may not set {', '.join(map(repr, reserved))} (hpo sets "
            "it: a record's tools go in its 'tools' field)"
        )


def _no_template_kwargs(record: dict[str, Any], what: str) -> None:
    if record.get("chat_template_kwargs") is not None:
        raise _BadLine(
            f"field 'chat_template_kwargs' in {what} record: only chat records (messages, "
            "conversational prompt/completion, Alpaca, ShareGPT) are rendered by a chat template"
        )


def _validate_sharegpt(record: dict[str, Any]) -> None:
    _validate_turns(
        record["conversations"], "conversations", ("from", "value"), SHAREGPT_ROLES,
        "human, gpt, system, function_call or observation",
    )  # fmt: skip
    if record.get("system") is not None:
        _require_str(record, "system")
    _validate_messages(to_native("sharegpt", record)["messages"], field="conversations")


def _sharegpt_calls(value: str) -> list[dict[str, Any]]:
    """A LLaMA-Factory `function_call` turn's calls, in the messages' `tool_calls` form: its
    value is the JSON of one call `{"name": ..., "arguments": ...}` or of a list of them
    (arguments given as a JSON string are read as an object where they parse)."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        raise _BadLine(f"a function_call value must be the JSON of a call: {error}") from None
    calls = parsed if isinstance(parsed, list) else [parsed]
    out = []
    for call in calls:
        if not (isinstance(call, dict) and isinstance(call.get("name"), str)):
            raise _BadLine('a function_call value must hold {"name": ..., "arguments": ...}')
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass  # a template takes it as given
        out.append({"type": "function", "function": {"name": call["name"], "arguments": arguments}})
    return out


def _sharegpt_tools(tools: Any) -> list[dict[str, Any]] | None:
    """A ShareGPT record's `tools` (LLaMA-Factory: the JSON of a list of function
    descriptions, or of one), each in the `{"type": "function", "function": ...}` form chat
    templates take; None when it gives none."""
    if tools == []:
        return None
    if isinstance(tools, str) and tools.lstrip().startswith("{"):
        tools = f"[{tools}]"  # one function
    listed = _tools({"tools": [tools] if isinstance(tools, dict) else tools})
    return [t if "type" in t else {"type": "function", "function": t} for t in listed or []] or None


def _validate_turns(
    turns: Any, field: str, keys: tuple[str, str], roles: Collection[str], expected: str
) -> None:
    """A non-empty list of objects, each with a known role and a string text.

    `keys` names the role and the text of a turn, `expected` the roles in the message.
    """
    if not isinstance(turns, list) or not turns:
        raise _BadLine(f"field '{field}' must be a non-empty list, got {_json_type(turns)}")
    role_key, text_key = keys
    for index, turn in enumerate(turns):
        where = f"{field}[{index}]"
        if not isinstance(turn, dict):
            raise _BadLine(f"{where} must be an object, got {_json_type(turn)}")
        role = turn.get(role_key)
        if role not in roles:
            raise _BadLine(f"{where} has unknown role {role!r} (expected {expected})")
        text = turn.get(text_key)
        if text_key == "content" and text is None and _calls_tools(turn):
            continue
        if text_key == "content" and isinstance(text, list):
            _text_parts(text, f"{where}.content")
        elif not isinstance(text, str):
            got = _json_type(text) if text_key in turn else "nothing"
            raise _BadLine(f"{where}.{text_key} must be a string, got {got}")


def _calls_tools(turn: dict[str, Any]) -> bool:
    """An assistant message that calls tools (`tool_calls`: a non-empty list of objects)."""
    calls = turn.get("tool_calls")
    return (
        turn.get("role") == "assistant" and isinstance(calls, list) and bool(calls)
        and all(isinstance(call, dict) for call in calls)
    )  # fmt: skip


def _text_parts(parts: list[Any], where: str) -> str:
    """The text of OpenAI-style content parts (`[{"type": "text", "text": ...}, ...]`), one
    line each, as vLLM joins them; raises _BadLine on any other part (an image: hpo trains
    text models)."""
    texts = []
    for index, part in enumerate(parts):
        if not (isinstance(part, dict) and part.get("type") == "text"):
            kind = part.get("type") if isinstance(part, dict) else _json_type(part)
            raise _BadLine(f"{where}[{index}] is of type {kind!r}; only text parts are trained")
        if not isinstance(part.get("text"), str):
            raise _BadLine(f"{where}[{index}].text must be a string, got {_json_type(part.get('text'))}")
        texts.append(part["text"])
    if not texts:
        raise _BadLine(f"{where} is an empty list of parts")
    return "\n".join(texts)


def _validate_messages(messages: Any, field: str = "messages") -> None:
    _validate_turns(
        messages, field, ("role", "content"), ROLES, "system, user, assistant or tool"
    )
    if messages[0]["role"] == "assistant":
        raise _BadLine(
            f"{field}[0] is an assistant message; start with a system or user message"
        )
    if not any(message["role"] == "assistant" for message in messages):
        raise _BadLine("no assistant message (nothing to learn from)")


def _require_str(record: dict[str, Any], field: str) -> str:
    if field not in record:
        raise _BadLine(f"missing field {field!r} (--data-columns {field}=COLUMN reads another column as it)")
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
    context: list[dict[str, Any]] = []  # messages without loss (a conversational prompt)
    if shape == "prompt_completion" and isinstance(record["prompt"], list):
        context = [_message(m) for m in record["prompt"]]
        messages = context + [_message(m) for m in record["completion"]]
    elif shape == "prompt_completion":
        return [
            (prefix, False),
            (record["prompt"], False),
            (record["completion"], True),
            (eos, True),
        ]
    else:
        messages = [_message(m) for m in record["messages"]]
    tools = record.get("tools") or None
    kwargs = record.get("chat_template_kwargs") or {}
    options = {"tools": tools, **kwargs}  # apply_chat_template's, as TRL passes them
    _check_template_kwargs(kwargs, tokenizer)
    for key in sorted({k for m in messages for k in m} - {"role", "content", "tool_calls"}):
        _check_rendered(key, messages, tokenizer, options)
    if tokenizer.chat_template:
        if tools and _first_time(str(tokenizer.chat_template), "tools"):
            try:
                same = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs) == (
                    tokenizer.apply_chat_template(messages, tokenize=False, **options)
                )
            except Exception:  # the record's own rendering says what is wrong
                same = False
            if same:
                log.warning(
                    "records give tools, which the tokenizer's chat template does not render: "
                    "the model is trained without their descriptions"
                )
        if any("tool_calls" in m for m in messages) and not _renders(
            "tool_calls", messages, tokenizer, options
        ):
            # Trained, such a reply would teach the model to answer a request with nothing.
            raise _BadLine(
                "the tokenizer's chat template does not render tool calls (a chat_template.jinja "
                "in the model's folder that does replaces it)"
            )
        if context:
            return _completion_after_prompt(context, messages, tokenizer, options)
        return _render_with_template(messages, tokenizer, options)
    if tools or any("tool_calls" in m for m in messages):
        # hpo's own `<|role|>` lines have no format for a call: it would not be trained.
        raise _BadLine(
            "tools and tool calls need the model's chat template; this tokenizer has none "
            "(a chat_template.jinja in the model's folder gives it one)"
        )
    pieces: list[Piece] = [(prefix, False)]
    for index, message in enumerate(messages):
        is_assistant = message["role"] == "assistant" and index >= len(context)
        pieces.append((f"<|{message['role']}|>\n", False))
        pieces.append((message["content"], is_assistant))
        if is_assistant:
            pieces.append((eos, True))
        pieces.append(("\n", False))
    return pieces


# (template, what) pairs already checked: what a template leaves out or changes is said once.
_CHECKED: set[tuple[str, str]] = set()


def _first_time(template: str, what: str) -> bool:
    """Whether `what` is checked under `template` for the first time in this process."""
    if (template, what) in _CHECKED:
        return False
    _CHECKED.add((template, what))
    return True


def _check_template_kwargs(kwargs: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> None:
    """Warn once per template and name when a record's `chat_template_kwargs` sets a variable
    the chat template never reads (`enable_thinking` under Llama 3's: the data's author
    expected a rendering that does not happen), or when there is no template at all."""
    template = str(tokenizer.chat_template or "")
    for key in sorted(kwargs):
        if key in template or not _first_time(template, f"chat_template_kwargs {key}"):
            continue
        log.warning(
            "records set chat_template_kwargs %r, which %s: it changes nothing in what is "
            "trained", key,
            "the tokenizer's chat template does not read" if template
            else "hpo's rendering without a chat template does not use",
        )  # fmt: skip


def _check_rendered(
    key: str,
    messages: list[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    options: dict[str, Any],
) -> None:
    """Warn once per template and field when a message field other than role and content
    (reasoning the data carries, say) is not in what is trained: a trace left out silently
    would train another objective on fewer tokens than the data holds (`_renders`)."""
    template = str(tokenizer.chat_template or "")
    if not _first_time(template, key):
        return
    if template and _renders(key, messages, tokenizer, options):
        return
    log.warning(
        "messages set %r, which %s does not render: it is not trained on (only what the "
        "template renders is)", key,
        "the tokenizer's chat template" if template else "hpo's rendering without a chat template",
    )  # fmt: skip


def _renders(
    key: str,
    messages: list[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    options: dict[str, Any],
) -> bool:
    """Whether the chat template renders the messages' `key`: the conversation up to the last
    message that sets it, rendered with and without it, differs (templates drop an earlier
    reply's reasoning by design, Qwen3's among them). A template that fails on it: True, the
    record's own rendering says what is wrong."""
    last = max(i for i, m in enumerate(messages) if key in m)
    turns = messages[: last + 1]
    try:
        kept = tokenizer.apply_chat_template(turns, tokenize=False, **options)
        left = tokenizer.apply_chat_template(
            [{k: v for k, v in m.items() if k != key} for m in turns], tokenize=False,
            **options,
        )  # fmt: skip
    except Exception:
        return True
    return bool(kept != left)


def fallback_chat_template(tokenizer: PreTrainedTokenizerBase) -> str:
    """The rendering ``_render`` gives a tokenizer without a chat template, as a Jinja template.

    Its ``{% generation %}`` markers enclose what carries loss here (an assistant's content and
    its eos), so a trainer that masks by them (transformers' ``return_assistant_tokens_mask``,
    TRL's ``assistant_only_loss``) trains the same tokens as this project's trainer.
    """
    prefix = special_prefix(tokenizer)
    if not prefix:
        start = ""
    elif prefix == [tokenizer.bos_token_id]:
        start = "{{ bos_token }}"
    else:  # a prefix of other special tokens: their text, as a Jinja string literal
        start = "{{ " + json.dumps(tokenizer.decode(prefix)) + " }}"
    return (
        start + "{% for message in messages %}"
        "{{ '<|' + message['role'] + '|>\\n' }}"
        "{% if message['role'] == 'assistant' %}"
        "{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
        "{% else %}{{ message['content'] }}{% endif %}"
        "{{ '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    )


def _render_with_template(
    messages: list[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    options: dict[str, Any],
) -> list[Piece]:
    """Pieces of a conversation rendered by the tokenizer's chat template.

    An assistant turn's labelled text is what rendering it adds to the rendering of the messages
    before it with the generation prompt, so the template's end-of-turn marker carries loss too.
    A template that does not render the conversation prefix by prefix (Mistral-Instruct v0.3's
    puts the system message into the last user turn, and drops it once an assistant reply is
    last; Qwen3's renders the last reply with an empty think block) is given the
    conversation as it is at inference for its last reply (`_last_reply_in_context`).
    """

    render = _renderer(tokenizer, options)

    def locate(turns: list[dict[str, Any]]) -> list[Piece]:
        pieces = _turns_in_order(turns, render)
        if pieces is None:
            pieces = _last_reply_in_context(turns, render, tokenizer.eos_token)
        if pieces is None:
            raise _BadLine(
                "the tokenizer's chat template does not render this conversation prefix by "
                "prefix, nor its last reply after its generation prompt (a reasoning template "
                "that opens a think block the reply lacks? a reply whose content starts with "
                "<think>...</think> trains, and a record's chat_template_kwargs "
                '{"enable_thinking": false} turns it off where the template reads it), so its '
                "assistant turns cannot be located; a chat_template.jinja in the model's "
                "folder that does replaces it"
            )
        return pieces

    try:
        return locate(messages)
    except _BadLine as refused:
        merged = _system_into_first_turn(messages)
        if merged is None or not str(refused).startswith("chat template failed"):
            raise
        pieces = locate(merged)  # a failure of its own is the record's
        if _first_time(str(tokenizer.chat_template), "system message"):
            log.warning(_SYSTEM_JOINED)
        return pieces


_SYSTEM_JOINED = (
    "the tokenizer's chat template refuses a system message: it is joined to the first user "
    "turn (system, a blank line, user), as Gemma 3's template does itself"
)


def _completion_after_prompt(
    prompt: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    options: dict[str, Any],
) -> list[Piece]:
    """A conversational prompt/completion record as TRL's SFTTrainer labels it: the whole
    conversation rendered, the loss on what follows its common beginning with the prompt
    rendered with the generation prompt (so an assistant turn inside the prompt is context)."""
    render = _renderer(tokenizer, options)
    try:
        before, whole = render(prompt, True), render(messages, False)
    except _BadLine as refused:
        merged = _system_into_first_turn(prompt)
        if merged is None or not str(refused).startswith("chat template failed"):
            raise
        completion = messages[len(prompt) :]
        before, whole = render(merged, True), render(merged + completion, False)
        if _first_time(str(tokenizer.chat_template), "system message"):
            log.warning(_SYSTEM_JOINED)
    start = len(os.path.commonprefix([before, whole]))
    if start < len(before) and _first_time(str(tokenizer.chat_template), "prompt prefix"):
        log.warning(
            "the chat template renders a prompt alone otherwise than with its completion: the "
            "loss starts where they differ, as in TRL (%r of the prompt is not in the sample)",
            before[start:],
        )
    if start == len(whole):
        raise _BadLine("the completion renders as nothing after the prompt")
    return [(whole[:start], False), (whole[start:], True)]


def _system_into_first_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The conversation with its leading system message joined to the first user turn, as
    Gemma 3's template does itself (Gemma 1's and 2's refuse a system message); None without
    a system message followed by a user turn."""
    if len(messages) < 2 or messages[0]["role"] != "system" or messages[1]["role"] != "user":
        return None
    first = {**messages[1], "content": messages[0]["content"] + "\n\n" + messages[1]["content"]}
    return [first, *messages[2:]]


def renders_in_order(
    messages: list[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    tools: list[Any] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> bool:
    """Whether the tokenizer's chat template renders `messages` prefix by prefix: the whole
    conversation is then one rendering, as a trainer that masks by the template (TRL's
    `assistant_only_loss`, prompt/completion records) sees it too."""
    render = _renderer(tokenizer, {"tools": tools, **(chat_template_kwargs or {})})
    try:
        return _turns_in_order([_message(m) for m in messages], render) is not None
    except _BadLine:  # a template that fails on it: not a rendering anyone trains on
        return False


def _renderer(tokenizer: PreTrainedTokenizerBase, options: dict[str, Any]) -> Any:
    """`render(messages, generation_prompt) -> text` by the tokenizer's chat template, given
    `options` (the record's `tools` and `chat_template_kwargs`); a template's failure raises
    _BadLine ("chat template failed: ...")."""

    def render(part: list[dict[str, Any]], generation_prompt: bool) -> str:
        try:
            text = tokenizer.apply_chat_template(
                part, tokenize=False, add_generation_prompt=generation_prompt, **options
            )
        except Exception as error:  # jinja raises its own errors (e.g. role order rules)
            raise _BadLine(f"chat template failed: {error}") from None
        if not isinstance(text, str):
            raise _BadLine(f"chat template returned {type(text).__name__}, expected text")
        return text

    return render


def _turns_in_order(messages: list[dict[str, Any]], render: Any) -> list[Piece] | None:
    """The pieces when each assistant turn extends the rendering of the turns before it (with
    the generation prompt) and the whole conversation's rendering extends that; else None."""
    full = render(messages, False)
    pieces: list[Piece] = []
    cursor = 0
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(messages[:index], True)
        upto = render(messages[: index + 1], False)
        if len(before) < cursor or not (upto.startswith(before) and full.startswith(upto)):
            return None
        pieces.append((full[cursor : len(before)], False))
        pieces.append((full[len(before) : len(upto)], True))
        cursor = len(upto)
    pieces.append((full[cursor:], False))
    return pieces


def _last_reply_in_context(
    messages: list[dict[str, Any]], render: Any, eos: str | None
) -> list[Piece] | None:
    """The conversation as the model sees it when it writes its last reply: the turns before
    that reply rendered with the generation prompt, then what rendering the reply adds to
    them; every reply labelled. None where the reply's rendering does not extend that prompt
    (a reasoning template whose generation prompt opens a `<think>` the reply lacks).

    Templates that render a conversation otherwise once a reply is last: Mistral-Instruct
    v0.3's moves the system message into the last user turn; Qwen3's, Phi-3's, gpt-oss's
    render the last reply unlike the earlier ones (an empty think block, eos, another end
    marker). An earlier reply is labelled as the conversation without its system messages
    renders it, where that renders prefix by prefix and the prompt holds it (Mistral's); else
    from the end of the turns before it rendered with the generation prompt, where the prompt
    goes on so, or else from its content. It ends after its content and the last reply's
    end-of-turn marker where the prompt has that marker there (without a trailing eos:
    Phi-3's), a reply that calls tools at the first such marker after its content (its calls
    rendered before it), else after its content. Messages after the last reply carry no loss
    and are left out. Under a template that drops the reasoning from every reply and opens
    the think block in its generation prompt (DeepSeek-R1's), the last reply is what its
    content adds to that opening (`_reasoning_written`); an earlier reply whose content is
    not in the history is found by its answer, the text after its `</think>`.
    """
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prompt = render(messages[:last], True)
    whole = render(messages[: last + 1], False)
    body = [m for m in messages if m["role"] != "system"]
    in_order = _turns_in_order(body, render) if len(body) < len(messages) else None
    body_replies = [text for text, labelled in in_order or [] if labelled and isinstance(text, str)]
    if whole.startswith(prompt) and len(whole) > len(prompt):
        reply = whole[len(prompt) :]
    elif body_replies:  # the whole conversation drops what the prompt holds (Mistral's system)
        reply = body_replies[-1]
    elif (written := _reasoning_written(messages[last]["content"], prompt, whole)) is not None:
        reply = written
    else:
        return None
    content = _as_rendered(messages[last]["content"], reply)
    at = reply.rfind(content) if content else -1
    markers = [reply[at + len(content) :]] if at >= 0 else []
    if markers and eos and markers[0].endswith(eos) and len(markers[0]) > len(eos):
        markers.append(markers[0][: -len(eos)])
    pieces: list[Piece] = []
    cursor = 0
    earlier = [i for i, m in enumerate(messages[:last]) if m["role"] == "assistant"]
    for number, index in enumerate(earlier):
        span = _earlier_reply(
            prompt, cursor, render(messages[:index], True),
            _as_rendered(messages[index]["content"], prompt[cursor:]),
            body_replies[number] if number < len(body_replies) else None, markers,
            calls="tool_calls" in messages[index],
        )  # fmt: skip
        if span is None:
            return None
        pieces += [(prompt[cursor : span[0]], False), (prompt[span[0] : span[1]], True)]
        cursor = span[1]
    pieces += [(prompt[cursor:], False), (reply, True)]
    return pieces


def _reasoning_written(content: str, prompt: str, whole: str) -> str | None:
    """The last reply under a template whose generation prompt opens a think block and which
    drops the reasoning from every reply it renders (DeepSeek-R1-Distill's and V3's open
    `<think>\n`), where the content writes that reasoning (`<think>...</think>answer`): what
    the content adds to the opening, then the end-of-turn marker the template puts after
    the answer. The model writes just that after its generation prompt. None otherwise (a
    reply without reasoning under such a template is refused: it would teach the model to
    leave a think block it was given unclosed)."""
    start = prompt.rfind("<think>")
    opening = prompt[start:] if start >= 0 else ""
    # The prompt must end in the opening (the generation prompt's, not an earlier turn's).
    if opening.strip() != "<think>" or not content.startswith("<think>") or "</think>" not in content:
        return None
    overlap = len(os.path.commonprefix([opening, content]))
    answer = content.rsplit("</think>", 1)[-1].strip()
    at = whole.rfind(answer) if answer else -1
    if at < 0:
        return None
    return content[overlap:].rstrip() + whole[at + len(answer) :]


def _as_rendered(content: str, text: str) -> str:
    """A reply's content as `text` holds it: whole, or where it is not, what follows its
    reasoning (`<think>...</think>` written into the content, which Qwen3's, Nemotron 3's and
    DeepSeek's templates drop from a reply in the history)."""
    content = content.strip()
    if content in text or "</think>" not in content:
        return content
    return content.rsplit("</think>", 1)[-1].strip()


def _earlier_reply(
    prompt: str,
    cursor: int,
    before: str,
    content: str,
    as_body: str | None,
    markers: list[str],
    *,
    calls: bool = False,
) -> tuple[int, int] | None:
    """Where an earlier reply lies in `prompt` (from `cursor`), as `_last_reply_in_context`
    says; a reply that calls tools runs on to the end-of-turn marker after its content (its
    calls rendered there), one without content starts at the end of `before`. None when it
    cannot be found."""
    if as_body is not None and (found := prompt.find(as_body, cursor)) >= 0:
        return found, found + len(as_body)
    start = len(before) if len(before) >= cursor and prompt.startswith(before) else None
    if content:
        at = prompt.find(content, cursor if start is None else start)
    else:
        at = start if start is not None and calls else -1
    if at < 0:
        return None
    end = at + len(content)
    for marker in markers:
        found = prompt.find(marker, end) if marker else -1
        if found == end or (found > end and calls):
            end = found + len(marker)
            break
    begin = at if start is None else start
    return (begin, end) if end > begin else None  # a call found nowhere: not trained silently


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
