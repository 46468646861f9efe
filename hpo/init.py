"""`python -m hpo.init`: a guided set-up that writes a commented `study.yaml`.

In a terminal it asks for the model folder, the data file (and says how many samples and
tokens it found), the window, the safety margin, the price per hour, the GPUs per full run
and the profiles; it detects the hardware, writes the file and prints the exact
`python -m hpo.study` command.
A bad answer is asked again with the reason. Every question has a flag; with `--yes` (or
without a terminal) nothing is asked: flags and defaults make the file, and a bad value
stops with one line naming the flag (exit 2). The file is checked by the same loader
`hpo.study --config` uses before it is put in place, so nothing half-written is left.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import shlex
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from common.checks import bound_violated
from common.cli import EXIT_OK, run_cli
from common.errors import BadInputError
from common.files import write_atomic
from hpo.config import Budget, load_config
from trainers.run_options import RunWindow


@dataclass(frozen=True)
class Question:
    """One thing the set-up needs: its flag, what the terminal asks, how an answer is read.

    `read` turns the answer (and the answers before it) into a value or raises
    `BadInputError` saying why not.
    """

    key: str
    prompt: str
    read: Callable[[str, dict[str, Any]], Any]
    default: str | None = None


def read_model(text: str, _: dict[str, Any]) -> str:
    folder = Path(text).expanduser()
    if not (folder / "config.json").is_file():
        raise BadInputError(f"model: {text!r} is not a model folder (no config.json in it)")
    return str(folder.resolve())


def read_data(text: str, _: dict[str, Any]) -> str:
    from trainers.data.sources import open_source

    path = Path(text).expanduser()
    if not path.exists():
        raise BadInputError(f"data: no file at {text!r}")
    try:
        open_source(path)
    except BadInputError as error:
        raise BadInputError(f"data: {error}") from None
    return str(path.resolve())


def _budget_question(field: dataclasses.Field[Any]) -> Question:
    """The question of a `Budget` field: its prompt, default and bounds come from the field."""

    whole = field.type in ("int", int)  # a count (gpus_per_run), not a quantity

    def read(text: str, values: dict[str, Any]) -> float:
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            what = "a whole number" if whole else "a number"
            raise BadInputError(f"{field.name}: expected {what}, but got {text!r}") from None
        problem = bound_violated(field, value)
        if problem:
            raise BadInputError(f"{field.name}: {problem}, but got {text!r}")
        answered = {**values, field.name: value}
        window: dict[str, Any] = {f.name: answered.get(f.name) for f in fields(RunWindow)}
        if None not in window.values():
            RunWindow(**window)  # the margin inside the window, once both are answered
        return value

    return Question(field.name, field.metadata["ask"], read, f"{field.default:g}")


def read_profiles(text: str, _: dict[str, Any]) -> list[str] | None:
    from search_spaces import load_space

    known = load_space().profile_names
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or names == ["all"]:
        return None
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BadInputError(
            f"profiles: unknown {', '.join(unknown)}; known: {', '.join(known)} (or 'all')"
        )
    return names


QUESTIONS = (
    Question("model", "Model folder (a local transformers model)", read_model),
    Question(
        "data",
        "Training data (JSONL, Parquet, CSV, JSON, a folder of them or a save_to_disk folder: text, "
        "prompt/completion, messages, Alpaca or ShareGPT)",
        read_data,
    ),
    *(_budget_question(f) for f in fields(Budget) if "ask" in f.metadata),
    Question("profiles", "Profiles to search (comma-separated, or 'all')", read_profiles, "all"),
)


# Budget fields the set-up does not ask for, but takes as flags.
_NOT_ASKED = tuple(f for f in fields(Budget) if f.name in ("search_hours", "search_budget_pct"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpo.init",
        description="Guided set-up: asks what a study needs and writes a commented study.yaml.",
    )
    for q in QUESTIONS:
        default = f" Default: {q.default}." if q.default else ""
        parser.add_argument(
            "--" + q.key.replace("_", "-"), dest=q.key, help=q.prompt + "." + default
        )
    # Not asked: the default (10 % of the full run's p50 from an hour of full run) suits most.
    for field in _NOT_ASKED:
        help = f"{field.metadata['help']} Not asked.".replace("%", "%%")
        parser.add_argument("--" + field.name.replace("_", "-"), type=float, help=help)
    parser.add_argument(
        "--out", default="study.yaml", help="The file to write. Default: study.yaml."
    )
    parser.add_argument(
        "--yes", action="store_true", help="Ask nothing: flags, else defaults (no terminal needed)."
    )
    parser.add_argument("--force", action="store_true", help="Replace an existing --out file.")
    return parser


def ask(question: Question, given: str | None, interactive: bool, values: dict[str, Any]) -> Any:
    """The answer to `question`: the flag's, else the terminal's (asked until it reads)."""
    if given is not None:
        return question.read(given, values)
    if not interactive:
        if question.default is None:
            flag = "--" + question.key.replace("_", "-")
            raise BadInputError(f"{question.key}: no terminal to ask in; pass {flag}")
        return question.read(question.default, values)
    suffix = f" [{question.default}]" if question.default is not None else ""
    while True:
        answer = input(f"{question.prompt}{suffix}: ").strip()
        if not answer and question.default is not None:
            answer = question.default
        try:
            return question.read(answer, values)
        except BadInputError as exc:
            print(f"  {exc}; please try again", flush=True)


@dataclass(frozen=True)
class Findings:
    """What the set-up found: the data's size and lengths, the model, the hardware."""

    data: str
    model: str
    hardware: str


def inspect(model: str, data: str) -> Findings:
    """Tokenize the data with the model's tokenizer; describe the model and the machine.

    Raises:
        BadInputError: The data cannot be read, or the model has no usable tokenizer.
    """
    from analysis.timemodel.machine import model_profile, this_machine
    from hpo.prepare import model_context
    from trainers.data.dataset import DataSpec, load_tokenized
    from trainers.model.lora import load_tokenizer

    context = model_context(model)
    with tempfile.TemporaryDirectory(prefix="hpo-init-") as cache:
        tokenized = load_tokenized(
            DataSpec(path=data, max_length=context, cache_dir=cache), load_tokenizer(model)
        )
    stats = tokenized.stats
    profile = model_profile(model)
    hardware = this_machine()
    memory_gb = hardware.memory_bytes / 1e9
    return Findings(
        data=f"{stats.samples:,} {stats.shape} samples; tokens per sample p50 "
        f"{stats.tokens_p50:.0f}, p95 {stats.tokens_p95:.0f}, max {stats.tokens_max:,} "
        f"(model context {context:,})",
        model=f"{profile.total_parameters / 1e6:,.1f} M parameters, {profile.n_layers} layers",
        hardware=f"{hardware.device_kind} ({hardware.device_name}), {hardware.cpu_cores} "
        f"CPU cores, {memory_gb:.1f} GB memory, {hardware.precision}",
    )


def _search_lines(values: dict[str, Any]) -> str:
    """The search budget: given values, else the default said in a comment."""
    text = (
        "  # What the search itself may spend (GPU-hours of all workers): search_hours, or\n"
        "  # search_budget_pct of the full run's predicted p50 (default 10 % once that is an\n"
        "  # hour or more). The study plans its trials into it and ends when it is spent.\n"
    )
    given = [key for key in ("search_hours", "search_budget_pct") if values.get(key) is not None]
    if not given:
        return text + "  # search_budget_pct: 10\n"
    return text + "".join(f"  {key}: {values[key]:g}\n" for key in given)


def render(values: dict[str, Any], found: Findings) -> str:
    """The commented YAML."""

    def value(key: str) -> str:
        text = yaml.safe_dump(values[key], default_flow_style=True, width=1000)
        return text.strip().removesuffix("...").strip()

    today = dt.date.today().isoformat()
    profiles = "" if values["profiles"] is None else f"profiles: {value('profiles')}\n"
    return (
        f"# A study written by python -m hpo.init on {today}.\n"
        "# Every field has a flag of python -m hpo.study that overrides it (--help lists all).\n"
        f"# Hardware found: {found.hardware}.\n"
        "\n"
        f"# The base model: {found.model}.\n"
        f"model: {value('model')}\n"
        f"# The training data: {found.data}.\n"
        f"data: {value('data')}\n"
        "\n"
        "budget:\n"
        "  # The full run must end inside this window (trials that would not are never trained).\n"
        f"  window_hours: {value('window_hours')}\n"
        "  # Kept free at the end of the window: the full run stops and saves before it.\n"
        f"  safety_margin_minutes: {value('safety_margin_minutes')}\n"
        "  # One GPU's price per hour: the estimate's cost (x gpus_per_run for the full run).\n"
        f"  price_per_hour: {value('price_per_hour')}\n"
        "  # GPUs the full run trains on, data-parallel on one node; trials run on one GPU.\n"
        f"  gpus_per_run: {value('gpus_per_run')}\n" + _search_lines(values) + "\n"
        "# Batch profiles the search chooses from (search_spaces/profiles.yaml); all when absent.\n"
        + profiles
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    if out.exists() and not args.force:
        raise BadInputError(f"{out} exists; pass --force to replace it, or another --out")
    search = {field.name: getattr(args, field.name) for field in _NOT_ASKED}
    for field in _NOT_ASKED:
        problem = bound_violated(field, search[field.name])
        if problem:
            raise BadInputError(f"{field.name}: {problem}, but got {search[field.name]:g}")
    interactive = not args.yes and sys.stdin.isatty()
    values: dict[str, Any] = {}
    found: Findings | None = None
    for question in QUESTIONS:
        values[question.key] = ask(question, getattr(args, question.key), interactive, values)
        if question.key == "data":
            found = inspect(values["model"], values["data"])
            print(f"found: {found.data}; model: {found.model}", flush=True)
    assert found is not None
    values.update(search)
    write_checked(out, render(values, found))
    print(f"hardware: {found.hardware}")
    print(f"wrote {out}; run the study with:")
    print(f"  python -m hpo.study --config {shlex.quote(str(out))}")
    return EXIT_OK


def write_checked(out: Path, text: str) -> None:
    """Check `text` with the loader `hpo.study --config` uses, then write it atomically."""
    with tempfile.TemporaryDirectory(prefix="hpo-init-") as folder:
        draft = Path(folder) / "study.yaml"
        draft.write_text(text, encoding="utf-8")
        load_config(str(draft))
    write_atomic(out, text)


if __name__ == "__main__":
    sys.exit(run_cli(main))
