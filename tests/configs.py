"""Study configurations and training specs of the tiny model, as the tests build them.

Each test keeps the values it is about; these fill in what the tests' studies and runs
otherwise write again each time (where the model, data and folders are, short trials).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpo.config import StudyConfig, load_config
from trainers.data.paths import demo_data_path
from trainers.spec import TrainSpec

# A short study of the tiny model: one configuration profile, few short trials, no pruner.
SHORT_STUDY: dict[str, Any] = {
    "n_trials": 1,
    "trial_fraction": 0.02,
    "trial_evals": 2,
    "eval_samples": 8,
    "profiles": ["fast"],
    "pruner": "none",
    # No rungs after the trials: the tests about them set them.
    "rungs": "none",
    # No loss-shape reference run (a fifth run after three trials): the tests about it set it.
    "reference_fraction": 0.0,
}


def short_study(work: Path, model: Path, values: Mapping[str, Any]) -> StudyConfig:
    """The validated config of a SHORT_STUDY of `model` in `work`; `values` win."""
    return load_config(None, {"model": str(model), "work_dir": str(work), **SHORT_STUDY, **values})


def demo_spec(model: Path, folder: Path, **fields: Any) -> TrainSpec:
    """A run of `model` on the bundled prompt/completion data, writing under `folder`.

    Its adapter and checkpoints go to `folder/out`, the tokenized data to `folder/cache`;
    `fields` set the rest of the TrainSpec (and may move those two).
    """
    values: dict[str, Any] = {
        "model": str(model),
        "data": str(demo_data_path("prompt_completion")),
        "output_dir": str(folder / "out"),
        "cache_dir": str(folder / "cache"),
        **fields,
    }
    return TrainSpec(**values)


def demo_records(path: Path, n: int) -> Path:
    """The bundled prompt/completion data's first `n` records, written to `path`."""
    lines = demo_data_path("prompt_completion").read_text().splitlines()[:n]
    path.write_text("\n".join(lines) + "\n")
    return path


# A chat template that behaves as Mistral-Instruct v0.3's does (written for the tests, not
# copied): a system message joins the *last* user turn, so it is dropped once an assistant
# reply is last, and a reply renders as " " + its trimmed content + eos. No rendering of a
# whole conversation with a system message is how the model sees it when it replies.
SYSTEM_IN_LAST_TURN = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}"
    "{%- set turns = messages[1:] %}{%- else %}{%- set turns = messages %}{%- endif %}"
    "{{- bos_token }}{%- for m in turns %}"
    "{%- if m['role'] == 'user' %}"
    "{%- if loop.last and system is defined %}{{- '[INST] ' + system + '\\n\\n' + m['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + m['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif m['role'] == 'assistant' %}{{- ' ' + m['content'] | trim + eos_token }}{%- endif %}"
    "{%- endfor %}"
)


# A conversation with a tool: its schema, a reply that only calls it, its result, the answer.
WEATHER_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}}]  # fmt: skip
TOOL_CHAT = {
    "tools": WEATHER_TOOLS,
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ]},
        {"role": "tool", "content": "sunny, 21 C"},
        {"role": "assistant", "content": "It is sunny in Paris."},
    ],
}  # fmt: skip
