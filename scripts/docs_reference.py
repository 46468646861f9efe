"""The command and configuration reference, generated from the code at every docs build.

An MkDocs hook (`mkdocs.yml`: ``hooks:``): before the pages are read it writes
`docs/reference/*.md` (ignored by git) from the parsers the commands themselves build and from
the config dataclasses behind them, so a flag cannot exist without its page, and its help,
default and bounds are the ones `--help` and the checks use. `python scripts/docs_reference.py`
writes the same pages without a build.

Each command's parser is taken from its own `main`: `argparse.ArgumentParser.parse_args` is
replaced for the call and stops it with the parser, before the command reads or writes
anything. A flag generated from a config field (`common.flags`) also shows the field's bounds
(``above``, ``at_least``, ``below``, ``at_most``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "reference"
# Commands beside `hpo COMMAND`: run as python -m only (a maintainer's tool).
OTHER_COMMANDS = {
    "demo-data": (
        "trainers.data.make_demo_data",
        "regenerate (or enlarge) the bundled demo data",
    )
}
_BOUNDS = {"above": ">", "at_least": ">=", "below": "<", "at_most": "<="}


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


@dataclasses.dataclass
class Command:
    """One command line: its name under `hpo`, its module and the parser it builds."""

    name: str
    module: str
    summary: str
    parser: argparse.ArgumentParser
    # option string -> the config field the flag was generated from (common.flags)
    fields: dict[str, dataclasses.Field[Any]]

    @property
    def entry(self) -> str:
        return f"hpo {self.name}" if self.name not in OTHER_COMMANDS else ""


def commands() -> list[Command]:
    """Every command line of the project, with the parser its `main` builds."""
    sys.path.insert(0, str(ROOT))
    from hpo.__main__ import COMMANDS

    found = []
    for name, (module, summary) in {**COMMANDS, **OTHER_COMMANDS}.items():
        parser, fields = _parser_of(module)
        found.append(Command(name, module, summary, parser, fields))
    return found


def _parser_of(module: str) -> tuple[argparse.ArgumentParser, dict[str, dataclasses.Field[Any]]]:
    import common.flags

    main = importlib.import_module(module if module != "analysis.report" else module + ".__main__")
    fields: dict[str, dataclasses.Field[Any]] = {}
    add_flag = common.flags._Adder.add_flag

    def recording_add_flag(
        self: Any, target: Any, field: Any, kind: Any, name: str, where: Any
    ) -> None:
        fields["--" + name] = field
        add_flag(self, target, field, kind, name, where)

    def capture(parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(parser)

    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", capture),
        mock.patch.object(argparse.ArgumentParser, "parse_known_args", capture),
        mock.patch.object(common.flags._Adder, "add_flag", recording_add_flag),
        mock.patch.object(sys, "argv", [f"python -m {module}"]),  # a parser's default prog
    ):
        try:
            main.main([])
        except _Captured as captured:
            return captured.parser, fields
    raise RuntimeError(f"{module}.main returned without parsing its arguments")


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _bounds(field: dataclasses.Field[Any] | None) -> str:
    if field is None:
        return ""
    return ", ".join(
        f"{sign} {field.metadata[k]:g}" for k, sign in _BOUNDS.items() if k in field.metadata
    )


def _flag_rows(command: Command) -> Iterator[tuple[str, list[argparse.Action]]]:
    for group in command.parser._action_groups:
        actions = [
            a for a in group._group_actions if a.option_strings and a.help != argparse.SUPPRESS
        ]
        actions = [a for a in actions if "--help" not in a.option_strings]
        if actions:
            yield ("flags" if group.title in (None, "options") else group.title), actions


def _default(action: argparse.Action) -> str:
    if action.default in (None, argparse.SUPPRESS) or action.nargs == 0:
        return ""  # a switch (store_true) is off unless given
    return _value(action.default)


def _value(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    # A default under the repository (the demo data's folder) is shown relative to it.
    return "" if value is None else str(value).replace(f"{ROOT}/", "")


def _flag_row(
    formatter: argparse.HelpFormatter,
    action: argparse.Action,
    field: dataclasses.Field[Any] | None,
) -> str:
    """One table row: the flag, its help, its default, its bounds or choices."""
    flags = ", ".join(f"`{o}`" for o in action.option_strings)
    metavar = action.metavar if isinstance(action.metavar, str) else None
    plain = action.option_strings[-1].lstrip("-").replace("-", "_").upper()
    if metavar and action.nargs != 0 and metavar != plain:  # only a metavar that says more
        flags += f" `{metavar}`"
    help_text = formatter._expand_help(action) if action.help else ""  # type: ignore[attr-defined]
    default = _default(action)
    if field is not None:  # a config field's flag: its default from the field, not the help
        if field.default is not dataclasses.MISSING:
            default = _value(field.default)
            help_text = help_text.removesuffix(f" Default: {field.default}.")
    limits = _bounds(field)
    if action.choices:
        limits = " \\| ".join(str(c) for c in action.choices)
    if action.required:
        help_text = "Required. " + help_text
    return f"| {flags} | {_cell(help_text)} | {_cell(default)} | {_cell(limits)} |"


def command_page(command: Command) -> str:
    formatter = command.parser._get_formatter()
    usage = command.parser.format_usage().strip().removeprefix("usage: ")
    title = command.entry or f"python -m {command.module}"
    lines = [f"# {title}", "", f"{command.parser.description or command.summary}", ""]
    if command.entry:
        lines += [f"`{command.entry}` is `python -m {command.module}` (the `hpo` command).", ""]
    if usage.count("\n") < 4:  # a long usage line only repeats the tables below
        lines += ["```text", usage, "```", ""]
    positionals = [a for a in command.parser._actions if not a.option_strings]
    for action in positionals:
        lines.append(
            f"- `{action.metavar or action.dest}`: {_cell(formatter._expand_help(action))}"
        )
    for title, actions in _flag_rows(command):
        lines += ["", f"## {title}", "", "| flag | what it sets | default | bounds or choices |"]
        lines.append("|---|---|---|---|")
        for action in actions:
            field = next(
                (command.fields[o] for o in action.option_strings if o in command.fields), None
            )
            lines.append(_flag_row(formatter, action, field))
    return "\n".join(lines) + "\n"


def _type_name(kind: Any) -> str:
    text = kind.__name__ if isinstance(kind, type) else str(kind)
    return text.replace("typing.", "").replace("NoneType", "None")


def _yaml_rows(cls: type, prefix: str = "") -> Iterator[str]:
    from common.config import flat_fields, part_type

    hints = typing.get_type_hints(cls)
    for key, part, field in flat_fields(cls):
        kind = typing.get_type_hints(hints[part.name])[field.name] if part else hints[field.name]
        nested = None if part else part_type(cls, field)
        if nested is not None:
            yield f"| `{prefix}{key}:` | section | | | {_cell(field.metadata.get('help') or '')} |"
            yield from _yaml_rows(nested, f"{prefix}{key}.")
            continue
        default = "" if field.default is dataclasses.MISSING else _value(field.default)
        help_text = field.metadata.get("help", "")
        yield (
            f"| `{prefix}{key}` | {_cell(_type_name(kind))} | {_cell(default)} | "
            f"{_cell(_bounds(field))} | {_cell(help_text)} |"
        )


def study_yaml_page() -> str:
    from hpo.config import StudyConfig

    lines = [
        "# Study YAML (`--config`)",
        "",
        "The keys of a study file, `python -m hpo.study --config study.yaml`. Every key is also",
        "a flag (`trial_fraction` -> `--trial-fraction`, `budget.window_hours` ->",
        "`--window-hours`); a flag given overrides the file. Only `budget` is a section of its",
        "own; the other keys are flat. Generated from `hpo.config.StudyConfig`.",
        "",
        "| key | type | default | bounds | what it sets |",
        "|---|---|---|---|---|",
        *_yaml_rows(StudyConfig),
    ]
    return "\n".join(lines) + "\n"


def _section_rows(cls: type, keep: Any, prefix: str) -> Iterator[str]:
    """Rows of `cls`'s fields that `keep(name)` admits, each under `prefix`."""
    from common.config import part_type

    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if not keep(field.name):
            continue
        nested = part_type(cls, field)
        if nested is not None:
            yield from _section_rows(nested, lambda _: True, f"{prefix}{field.name}.")
            continue
        default = "" if field.default is dataclasses.MISSING else _value(field.default)
        yield (
            f"| `{prefix}{field.name}` | {_cell(_type_name(hints[field.name]))} | "
            f"{_cell(default)} | {_cell(_bounds(field))} | {_cell(field.metadata.get('help', ''))} |"
        )


def preset_page() -> str:
    from trainers import preset
    from trainers.spec import LoraSpec, TrainSpec

    data_fields = set(preset._DATA_FIELDS)
    not_training = set(preset._NOT_TRAINING)
    help_of = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(TrainSpec)}
    lines = [
        "# Preset file",
        "",
        "What `hpo.export` writes and `python -m trainers.train --preset FILE` runs (format",
        f"version {preset.PRESET_VERSION}). Every `training` key is also a flag of",
        "[hpo train](train.md) (`micro_batch_size` -> `--micro-batch-size`); a flag given",
        "overrides the file. The `training` section holds the full run's own settings",
        "(recovery, early stopping, checkpoint cadence included). Generated from",
        "`trainers.spec.TrainSpec` and `trainers.preset`; the defaults are a run's without a preset.",
        "",
        "| key | type | default | bounds | what it sets |",
        "|---|---|---|---|---|",
        "| `version` | int | | | The preset format's version. |",
        f"| `model.path` | str | | | {_cell(help_of['model'])} |",
        *_section_rows(LoraSpec, lambda _: True, "lora."),
        f"| `data.path` | str | | | {_cell(help_of['data'])} |",
        *_section_rows(TrainSpec, lambda name: name in data_fields, "data."),
        *_section_rows(TrainSpec, lambda name: name not in not_training, "training."),
        "",
        "Written beside them, read back but not settings: `launch` (the command and the GPUs it",
        "runs on), `estimate` (the study's duration, memory and final-loss bands, the loss",
        "correction applied: [scoring](../concepts/scoring.md)) and `provenance` (study, trial,",
        "storage, MLflow run, work dir, the rule that picked it).",
    ]
    return "\n".join(lines) + "\n"


def search_space_page() -> str:
    import search_spaces.domains
    import search_spaces.space

    root = ROOT / "search_spaces"
    families = sorted(p.stem for p in (root / "families").glob("*.yaml"))
    lines = [
        "# Search space YAML (`--space`)",
        "",
        "A study searches the space of its model's family (`search_spaces/families/<family>.yaml`,",
        f"picked by `model_type`: {', '.join(families)}), else `search_spaces/default.yaml`;",
        "`--space FILE` replaces it. Generated from `search_spaces/space.py`,",
        "`search_spaces/domains.py` and the shipped files.",
        "",
        "## The file",
        "",
        _docstring(search_spaces.space.__doc__),
        "",
        "## Domains",
        "",
        _docstring(search_spaces.domains.__doc__),
        "",
        "## The default space (`search_spaces/default.yaml`)",
        "",
        "```yaml",
        (root / "default.yaml").read_text(encoding="utf-8").rstrip(),
        "```",
        "",
        "## The profiles (`search_spaces/profiles.yaml`)",
        "",
        "```yaml",
        (root / "profiles.yaml").read_text(encoding="utf-8").rstrip(),
        "```",
    ]
    return "\n".join(lines) + "\n"


def _docstring(text: str | None) -> str:
    """A module docstring as Markdown: its reST literal blocks (``::``) fenced."""
    out: list[str] = []
    fenced = False
    for line in (text or "").strip().splitlines():
        if fenced and line and not line.startswith("    "):
            while out[-1] == "":
                out.pop()
            out += ["```", ""]
            fenced = False
        if fenced:
            if line or out[-1] != "```yaml":  # no blank first line in the block
                out.append(line[4:])
            continue
        if line.rstrip().endswith("::"):
            out += [line.rstrip()[:-1], "", "```yaml"]
            fenced = True
            continue
        out.append(line.replace("``", "`").replace(":func:", ""))
    if fenced:
        out.append("```")
    return "\n".join(out)


def index_page(found: list[Command]) -> str:
    lines = [
        "# Reference",
        "",
        "Generated from the code at every documentation build: each command's own parser and",
        "the config dataclasses behind its flags (`common/flags.py`). Every command has",
        "`--help`; exit code 0 on success, 2 on bad input (one line on stderr, nothing",
        "half-written), 1 otherwise (`trainers.train`: 3 when the window or a SIGTERM stopped",
        "it, resumable).",
        "",
        "| `hpo` command | `python -m` | what it does |",
        "|---|---|---|",
    ]
    for command in found:
        entry = f"`{command.entry}`" if command.entry else ""
        lines.append(
            f"| {entry} | [`{command.module}`]({command.name}.md) | {_cell(command.summary)} |"
        )
    lines += [
        "",
        "The files a user writes or edits: [Study YAML](study-yaml.md) (`--config`),",
        "[Preset file](preset.md) (`--preset`), [Search space YAML](search-space.md) (`--space`).",
    ]
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """Page file name -> its Markdown."""
    found = commands()
    out = {
        "index.md": index_page(found),
        "study-yaml.md": study_yaml_page(),
        "preset.md": preset_page(),
        "search-space.md": search_space_page(),
    }
    out.update({f"{c.name}.md": command_page(c) for c in found})
    return out


def write(out: Path = OUT) -> list[Path]:
    """Write the pages into `out`; a page whose text is unchanged is left alone."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in pages().items():
        path = out / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def on_pre_build(config: Any) -> None:
    """MkDocs hook: the reference is written before the pages are collected."""
    write()


if __name__ == "__main__":
    for path in write():
        print(path.relative_to(ROOT))
