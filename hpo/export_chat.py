"""Chat records in a TRL export: the loss on the tokens hpo's trainer puts it on.

hpo trains a conversation's assistant turns only (`trainers.data.records`): with a chat
template, what rendering a turn adds to the rendering of the messages before it with the
generation prompt; without one, its own `<|role|>` lines with the assistant's content and eos
labelled. `trl sft` on a `messages` file takes loss on every token unless told otherwise, and
fails outright on a tokenizer without a chat template. In the order tried:

0. Tools or tool calls (`datasets` 5 reads their JSON as it is; 4 makes Arrow structs of it,
   which give each record's schemas and arguments the keys of all the others, as nulls), or a
   template that renders some conversation
   otherwise once its last reply is in (Mistral
   v0.3's moves the system message into the last user turn and drops it then; Qwen3's,
   Phi-3's and gpt-oss's render the last reply unlike the earlier ones): hpo trains it as at
   that reply's inference, which no rendering of the whole conversation gives, so the
   records go tokenized (5.).

1. No chat template: hpo's own rendering as a Jinja file with `{% generation %}` markers
   (`fallback_chat_template`), `chat_template_path` and `assistant_only_loss`: the same text
   and the same labelled tokens.
2. One assistant reply per record, last (Alpaca's, most instruction data): conversational
   prompt/completion records. TRL then labels what rendering the reply adds to the prompt
   rendered with the generation prompt, hpo's own rule, under any template and any TRL 1.x.
3. A template with `{% generation %}` markers: `assistant_only_loss`.
4. A template the installed TRL knows a training version of
   (`trl.chat_template_utils.get_training_chat_template`): that version written beside the
   config, so a TRL that would not swap it in itself (1.0) trains on it too.
5. Otherwise (Mistral's template, custom ones): the records tokenized as hpo's trainer
   tokenizes them, `input_ids` with `assistant_masks` marking the tokens hpo labels. Both TRL
   1.0's collator and 1.16's preparation mask the labels by that column on data that comes
   with `input_ids`, and apply no template to it: the same tokens, the same loss, token for
   token. The data file is then bound to this tokenizer, as the preset is to this model.
6. The tokenizer is not here (a preset carried to another machine): every token carries loss,
   and the header says in how many records that differs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# `{% generation %}` with Jinja's whitespace-trim variants, as transformers finds it.
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass(frozen=True)
class ChatLoss:
    """How a chat data set goes to TRL.

    Attributes:
        config: `SFTConfig` fields to set (`chat_template_path` names `template`'s file).
        rows: The records converted for TRL (prompt/completion), or None to keep them.
        template: A chat template to write beside the config, or None.
        note: The header's line: what carries loss, and why.
        left_out: The indices of the records `rows` leaves out (the template cannot render
            them; hpo's trainer skips them too): every other record has its row, in order.
    """

    config: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] | None = None
    template: str | None = None
    note: str = ""
    left_out: tuple[int, ...] = ()


def chat_loss(records: Sequence[dict[str, Any]], model_path: str, template_file: str) -> ChatLoss:
    """Decide how `records` (native `messages` records) go to TRL; see the module's docstring.

    Args:
        records: The good records, `{"messages": [...]}` each.
        model_path: The preset's model folder, whose tokenizer renders them.
        template_file: Where a template would be written (the config names it).
    """
    from trainers.data.records import fallback_chat_template
    from trainers.model.lora import load_tokenizer

    try:
        tokenizer = load_tokenizer(model_path)
    except Exception:  # a preset carried to another machine: the model is not here
        tokenizer = None
    several = sum(1 for record in records if not _one_reply_last(record["messages"]))
    if tokenizer is not None and tokenizer.chat_template:
        from trainers.data.records import renders_in_order

        tooled = sum(1 for r in records if r.get("tools") or _calls(r["messages"]))
        if tooled:
            return _tokenized(
                records, tokenizer,
                f"chat data, {tooled:,} of {len(records):,} records with tools or tool calls: "
                "the records tokenized as hpo trains them, their tools and calls rendered by "
                "the model's chat template",
            )  # fmt: skip
        moved = sum(
            1 for r in records
            if not renders_in_order(
                r["messages"], tokenizer, r.get("tools"), r.get("chat_template_kwargs")
            )
        )  # fmt: skip
        if moved:
            return _tokenized(
                records, tokenizer,
                f"chat data, {moved:,} of {len(records):,} records rendered by the chat template "
                "otherwise once their last reply is in: the records tokenized as hpo trains "
                "them, each as the model sees it when it writes its last reply",
            )  # fmt: skip
    if tokenizer is not None and not tokenizer.chat_template:
        return ChatLoss(
            {"chat_template_path": template_file, "assistant_only_loss": True},
            template=fallback_chat_template(tokenizer),
            note=(
                "chat data, the tokenizer has no chat template: hpo's own rendering (<|role|> "
                f"lines, eos after each reply) in {template_file}, its {{% generation %}} "
                "markers around what hpo trains on (assistant_only_loss)"
            ),
        )
    if several == 0:
        rows = template_kwargs_everywhere([
            {
                "prompt": record["messages"][:-1], "completion": record["messages"][-1:],
                **{k: record[k] for k in ("tools", "chat_template_kwargs") if k in record},
            }
            for record in records
        ])  # fmt: skip
        return ChatLoss(
            {"completion_only_loss": True},
            rows=rows,
            note=(
                "chat data, one assistant reply per record: given to TRL as conversational "
                "prompt/completion, so the loss is on the reply as rendered by the model's chat "
                "template, as hpo trains it (completion_only_loss)"
            ),
        )
    template = _template_text(tokenizer)
    if template is not None and _GENERATION.search(template):
        return ChatLoss(
            {"assistant_only_loss": True},
            note=(
                "chat data: the loss on the assistant turns the model's chat template marks "
                "with {% generation %} (assistant_only_loss)"
            ),
        )
    training = _training_template(tokenizer) if template is not None else None
    if training is not None:
        return ChatLoss(
            {"chat_template_path": template_file, "assistant_only_loss": True},
            template=training,
            note=(
                "chat data: the loss on assistant turns only (assistant_only_loss) through TRL's "
                f"training version of the model's chat template, written to {template_file}"
            ),
        )
    if tokenizer is not None:
        return _tokenized(
            records, tokenizer,
            "chat data, several assistant turns and a chat template without {% generation %} "
            "markers nor a training version TRL knows: the records tokenized as hpo trains them",
        )  # fmt: skip
    return ChatLoss(
        note=(
            f"chat data takes loss on every token in TRL: {several:,} of {len(records):,} "
            "records have several assistant turns, and the model's tokenizer is not here to "
            "tell where they are (hpo: assistant turns only)"
        )
    )


def prompt_completion_loss(records: Sequence[dict[str, Any]], model_path: str) -> ChatLoss:
    """How conversational prompt/completion records go to TRL. TRL labels them by hpo's rule
    (what follows the prompt rendered with the generation prompt), but it has no rendering
    without a chat template nor a way past one that refuses a system message, and it cuts
    prompt and completion where their tokens differ where hpo cuts their text: so, with the
    model's tokenizer here, they go tokenized as hpo trains them (case 5); without it, as
    they are."""
    from trainers.model.lora import load_tokenizer

    try:
        tokenizer = load_tokenizer(model_path)
    except Exception:  # a preset carried to another machine: the model is not here
        return ChatLoss(
            {"completion_only_loss": True},
            note=(
                "conversational prompt/completion data, as it is (the model is not here to "
                "tokenize it): TRL puts the loss on the completion as rendered by the model's "
                "chat template after the prompt, as hpo does (completion_only_loss)"
            ),
        )
    return _tokenized(
        records, tokenizer,
        "conversational prompt/completion data: the records tokenized as hpo trains them, the "
        "loss on what the completion adds to the prompt rendered with the generation prompt",
    )  # fmt: skip


def _tokenized(records: Sequence[dict[str, Any]], tokenizer: Any, why: str) -> ChatLoss:
    """Case 5: the records as hpo's trainer tokenizes them, its labels as `assistant_masks`;
    `why` opens the header's line."""
    from trainers.data.records import IGNORE_INDEX, render_native, special_prefix, tokenize_pieces
    from trainers.data.sources import BadRecord

    prefix = special_prefix(tokenizer)
    pieces, left_out = [], []
    for number, record in enumerate(records):
        try:
            pieces.append(render_native(record, tokenizer, prefix))
        except BadRecord:  # hpo's trainer skips it too (it trains only with skip_bad_lines)
            left_out.append(number)
    rows = [
        {"input_ids": ids, "assistant_masks": [int(label != IGNORE_INDEX) for label in labels]}
        for ids, labels in tokenize_pieces(pieces, tokenizer)
    ]
    note = (
        f"{why}, input_ids with assistant_masks on the tokens hpo puts the loss on (the data "
        "file fits this model's tokenizer only)"
    )
    if left_out:
        note += (
            f"; {len(left_out):,} records the template cannot render left out, as hpo skips them"
        )
    return ChatLoss(rows=rows, note=note, left_out=tuple(left_out))


def uneven_template_kwargs(records: Sequence[dict[str, Any]]) -> bool:
    """Whether some records set `chat_template_kwargs` and others do not. TRL passes a
    record's as `**example.get("chat_template_kwargs", {})`, and `datasets` gives a record
    without them None there (a TypeError in TRL), a Parquet row another row's names as None
    (which a template reads as set)."""
    names = {frozenset(record.get("chat_template_kwargs") or {}) for record in records}
    return len(names) > 1


def template_kwargs_everywhere(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`records` written for TRL: where any sets `chat_template_kwargs`, every one carries
    them (`{}` where unset), which `datasets` 5 reads from JSON as they are."""
    if not any(record.get("chat_template_kwargs") for record in records):
        return records
    return [
        {**record, "chat_template_kwargs": record.get("chat_template_kwargs") or {}}
        for record in records
    ]


def _calls(messages: Sequence[dict[str, Any]]) -> bool:
    return any(message.get("tool_calls") for message in messages)


def _one_reply_last(messages: Sequence[dict[str, Any]]) -> bool:
    roles = [message["role"] for message in messages]
    return roles.count("assistant") == 1 and roles[-1] == "assistant"


def _template_text(tokenizer: Any) -> str | None:
    if tokenizer is None:
        return None
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named variants: TRL and transformers use `default`
        template = template.get("default")
    return template if isinstance(template, str) else None


def _training_template(tokenizer: Any) -> str | None:
    """TRL's training version of the tokenizer's template, when this TRL knows one."""
    try:
        from trl.chat_template_utils import get_training_chat_template
    except ImportError:  # the export does not need TRL installed
        return None
    try:
        template = get_training_chat_template(tokenizer)
    except Exception:  # none known (ValueError), or the template failed TRL's test renderings
        return None
    # None: the template needs no patching, which TRL says only of one with markers.
    return template if isinstance(template, str) and _GENERATION.search(template) else None
