"""Command-line flags generated from config dataclasses: one source for name, type and help.

Each field of a config dataclass becomes one flag, ``micro_batch_size`` -> ``--micro-batch-size``,
typed by its annotation and documented by ``field(metadata={"help": ...})``. A flag the user
does not give leaves nothing in the namespace (its default is ``argparse.SUPPRESS``), so flags
override a YAML file or a preset exactly where they were typed.

Field kinds: ``int``, ``float``, ``str``, ``bool`` (``--name`` / ``--no-name``), any of them
``| None``, ``tuple[str, ...]`` (comma-separated: ``--profiles fast,balanced``),
``str | tuple[str, ...]`` (one name stays a string, several make a tuple) and nested
dataclasses (parts, `common.config`): a section's fields become flags in a help group of its
own (``budget.window_hours`` -> ``--window-hours``), a flat part's fields flags named by their
keys (``trial.fraction`` -> ``--trial-fraction``).

Metadata read here:
    help: The flag's help text (required: every flag is documented).
    flag: The flag's name without the dashes, when it is not the field's name.
    flag_prefix: On a nested dataclass field: put before its fields' flag names (``lora-``).

Why not ``transformers.HfArgumentParser``: it puts every dataclass default into the namespace
(a flag not given would override the YAML or the preset), turns a nested dataclass into one
``--budget`` flag, feeds a ``tuple[str, ...]`` flag's text to ``tuple`` (characters, not names),
makes fields without a default required flags and spells every flag twice (``--a_b``, ``--a-b``).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from common.config import flat_fields, part_type

_NONE = type(None)
_NAMES = tuple[str, ...]


@dataclass(frozen=True)
class FieldFlags:
    """The flags generated from one config dataclass.

    Attributes:
        paths: argparse dest -> the field's path in the dataclass (``("budget", "window_hours")``).
    """

    paths: dict[str, tuple[str, ...]]

    def given(self, args: argparse.Namespace) -> dict[str, Any]:
        """The values the command line gave, nested like the dataclass; absent flags left out."""
        values: dict[str, Any] = {}
        for dest, path in self.paths.items():
            if hasattr(args, dest):
                node = values
                for key in path[:-1]:
                    node = node.setdefault(key, {})
                node[path[-1]] = getattr(args, dest)
        return values


def add_field_flags(
    parser: argparse.ArgumentParser,
    config: type,
    *,
    group: argparse._ArgumentGroup | None = None,
    show_defaults: bool = True,
) -> FieldFlags:
    """Add one flag per field of the dataclass `config` (nested dataclasses included).

    Args:
        parser: The parser; fields of nested dataclasses go into argument groups of it.
        config: The dataclass.
        group: The help group the top-level flags go into; default: the parser's own.
        show_defaults: Say the field's default in each help text (not where the command
            takes its defaults from elsewhere, as a full run's window from its preset).

    Returns:
        Which dest holds which field, to read the given values back with `FieldFlags.given`.

    Raises:
        TypeError: A field has no help text or a type no flag can parse (a programming error).
    """
    adder = _Adder(parser, show_defaults)
    adder.add_fields(group or parser, config, (), "")
    return FieldFlags(adder.paths)


@dataclass
class _Adder:
    parser: argparse.ArgumentParser
    show_defaults: bool
    paths: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def add_fields(
        self,
        target: argparse.ArgumentParser | argparse._ArgumentGroup,
        config: type,
        path: tuple[str, ...],
        prefix: str,
    ) -> None:
        hints = typing.get_type_hints(config)
        for key, part, field in flat_fields(config):
            if part is not None:  # a flat part: its fields' flags are named by their keys
                kind = typing.get_type_hints(hints[part.name])[field.name]
                self.add_flag(target, field, kind, key.replace("_", "-"), (key,))
                continue
            nested = part_type(config, field)
            where = (*path, field.name)
            if nested is not None:
                group = self.parser.add_argument_group(field.name, self.help(field))
                self.add_fields(
                    group, nested, where, prefix + field.metadata.get("flag_prefix", "")
                )
                continue
            name = field.metadata.get("key", prefix + field.metadata.get("flag", field.name))
            self.add_flag(target, field, hints[field.name], name.replace("_", "-"), where)

    def add_flag(
        self,
        target: argparse.ArgumentParser | argparse._ArgumentGroup,
        field: dataclasses.Field[Any],
        kind: Any,
        name: str,
        where: tuple[str, ...],
    ) -> None:
        dest = ".".join(where)
        target.add_argument(
            "--" + name,
            dest=dest,
            default=argparse.SUPPRESS,
            help=self.help(field),
            **_parsing(field, kind, name),
        )
        self.paths[dest] = where

    def help(self, field: dataclasses.Field[Any]) -> str:
        text = field.metadata.get("help")
        if not text:
            raise TypeError(f"{field.name} has no metadata help for its flag")
        default = field.default
        shown = default is not None and default is not dataclasses.MISSING
        if self.show_defaults and shown and not isinstance(default, bool):
            text = f"{text} Default: {default}."
        return str(text).replace("%", "%%")  # argparse %-formats help strings


def _parsing(field: dataclasses.Field[Any], kind: Any, flag: str) -> dict[str, Any]:
    """The argparse keywords that parse a field of type `kind`."""
    options = set(typing.get_args(kind)) - {_NONE} if _is_union(kind) else {kind}
    metavar = flag.replace("-", "_").upper()
    if options == {bool}:
        return {"action": argparse.BooleanOptionalAction}
    if options in ({int}, {float}, {str}):
        return {"type": options.pop(), "metavar": metavar}
    if options == {_NAMES}:
        return {"type": _names, "metavar": "NAME[,NAME...]"}
    if options == {str, _NAMES}:
        return {"type": _name_or_names, "metavar": "NAME[,NAME...]"}
    raise TypeError(f"{field.name}: no flag parses the type {kind!r}")


def _is_union(kind: Any) -> bool:
    return typing.get_origin(kind) in (typing.Union, types.UnionType)


def _names(text: str) -> tuple[str, ...]:
    """``"fast, balanced"`` -> ``("fast", "balanced")``."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, but got {text!r}")
    return names


def _name_or_names(text: str) -> str | tuple[str, ...]:
    """One name stays a string (``auto``); several make a tuple."""
    names = _names(text)
    return names[0] if len(names) == 1 else names


def study_parser(prog: str, description: str, *, required: bool = True) -> argparse.ArgumentParser:
    """A command's parser that starts with ``--study-name`` and ``--storage``: the Optuna study
    it reads (dests ``study_name``, ``storage``), declared once for every such command."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--study-name", required=required, help="The Optuna study's name.")
    parser.add_argument(
        "--storage",
        required=required,
        help="Its Optuna storage URL, e.g. sqlite:////abs/path/optuna.db.",
    )
    return parser
