"""`python -m hpo.init`: a guided set-up that writes a commented `study.yaml`.

In a terminal it asks for the model folder, the data file (and says how many samples and
tokens it found), the window, the safety margin, the price per hour, the GPUs per full run
and the profiles; it detects the hardware, writes the file and prints the exact
`python -m hpo.study` command. Two questions come only where the data needs them: which of
its columns to read as hpo's fields where no record shape matches them, and which split to
validate on where a data folder or saved `DatasetDict` has others beside train.
A bad answer is asked again with the reason (data that cannot be read asks for the columns,
or another file). Every question has a flag; with `--yes` (or
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


def read_columns(text: str, _: dict[str, Any]) -> str:
    from trainers.data.sources import parse_columns

    parse_columns(text)
    return text.strip()


def _split_question(splits: list[str]) -> Question:
    """Which of the data's other splits validates; none: a share of the train split."""

    def read(text: str, _: dict[str, Any]) -> str | None:
        if text in ("", "none"):
            return None
        if text not in splits:
            raise BadInputError(
                f"validation_split: the data has no {text!r} split (it has {', '.join(splits)}; "
                "or 'none')"
            )
        return text

    prompt = f"Split to validate on ({', '.join(splits)}; 'none': hold out a share of train)"
    # A validation split is what it is for; a test split the user may keep for the end.
    default = next((name for name in splits if name in ("validation", "valid", "dev")), "none")
    return Question("validation_split", prompt, read, default)


# Asked only where the data needs it (`settle_data`), else taken as flags.
COLUMNS = Question(
    "data_columns",
    "Columns to read as hpo's fields, FIELD=COLUMN joined by commas (Dolly's: "
    "instruction=instruction,input=context,output=response; empty: another data file)",
    read_columns,
    "",
)


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
    parser.add_argument("--data-columns", dest="data_columns", help=COLUMNS.prompt + ".")
    parser.add_argument(
        "--validation-split",
        help="A split of the data folder or saved DatasetDict to validate on (asked where it "
        "has one beside train). Default: a share of the train split.",
    )
    # Not asked: the default (a share of the full run's p50 from an hour of full run) suits most.
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
    other_splits: tuple[str, ...] = ()  # the data's splits beside train and the one validated
    length: str = ""  # the training length a study takes by default, and what it cuts


def inspect(
    model: str, data: str, columns: str | None = None, split: str | None = None,
    asks_split: bool = False,
) -> Findings:
    """Tokenize the data with the model's tokenizer (read through `columns`, validated on
    `split`); describe the model and the machine. `asks_split`: the caller asks which split
    validates, so the loader does not warn of the unread ones.

    Raises:
        BadInputError: The data cannot be read, or the model has no usable tokenizer.
    """
    from analysis.timemodel.machine import model_profile, this_machine
    from hpo.prepare import model_context
    from trainers.data.dataset import DataSpec, load_tokenized, long_tail_length
    from trainers.data.sources import open_source, splits_read, unread_splits_asked
    from trainers.model.lora import load_tokenizer

    if asks_split:
        unread_splits_asked(open_source(data))
    context = model_context(model)
    spec = DataSpec(path=data, max_length=context, validation_split=split, data_columns=columns)
    with tempfile.TemporaryDirectory(prefix="hpo-init-") as cache:
        spec = dataclasses.replace(spec, cache_dir=cache)  # read afresh: its splits are seen
        tokenized = load_tokenized(spec, load_tokenizer(model))
    stats = tokenized.stats
    held = (
        f"; {stats.validation_records:,} of them its {split} split, which validates" if split
        else ""
    )  # fmt: skip
    others = [name for name in splits_read(open_source(data)) if name not in ("train", split)]
    length = long_tail_length(stats.lengths, context)
    cut = sum(n > length for n in stats.lengths)
    profile = model_profile(model)
    hardware = this_machine()
    memory_gb = hardware.memory_bytes / 1e9
    return Findings(
        data=f"{stats.samples:,} {stats.shape} samples; tokens per sample p50 "
        f"{stats.tokens_p50:.0f}, p95 {stats.tokens_p95:.0f}, max {stats.tokens_max:,} "
        f"(model context {context:,}){held}",
        model=f"{profile.total_parameters / 1e6:,.1f} M parameters, {profile.n_layers} layers",
        hardware=f"{hardware.device_kind} ({hardware.device_name}), {hardware.cpu_cores} "
        f"CPU cores, {memory_gb:.1f} GB memory, {hardware.precision}",
        other_splits=tuple(others),
        length=f"# Tokens per training sample; a longer one is cut. The default is the data's "
        f"p99 token length,\n# {length:,} here, which cuts {cut:,} of {len(stats.lengths):,} "
        f"samples.\n# max_length: {length}\n",
    )


def settle_data(
    args: argparse.Namespace, interactive: bool, values: dict[str, Any]
) -> tuple[dict[str, Any], Findings]:
    """The data, the columns it is read through and the split it validates on, and what
    tokenizing it found. In a terminal, data that cannot be read asks for the columns where
    no record shape matched them (an empty answer: another file), else for another file; and
    a folder with splits beside train asks which validates.

    Raises:
        BadInputError: Without a terminal: the data cannot be read through the flags given.
    """
    data_question = next(q for q in QUESTIONS if q.key == "data")
    data = ask(data_question, args.data, interactive, values)
    columns = ask(COLUMNS, args.data_columns, False, values) if args.data_columns else None
    split = args.validation_split
    while True:
        try:
            found = inspect(values["model"], data, columns, split, interactive and split is None)
            break
        except BadInputError as error:
            if not interactive:
                raise
            text = str(error)
            print(f"  {text}; please try again", flush=True)
            if split is not None and (f"{split!r} split" in text or "validation_split" in text):
                split = None  # a split the data lacks, or data without splits
                continue
            if "--data-columns" in text:  # no record shape reads its columns
                columns = ask(COLUMNS, None, True, values) or None
                if columns is not None:
                    continue
            data, columns = ask(data_question, None, True, values), None
    if interactive and split is None and found.other_splits:
        question = _split_question(list(found.other_splits))
        while (split := ask(question, None, True, values)) is not None:
            try:  # a split of another record shape than train's cannot validate
                found = inspect(values["model"], data, columns, split)
                break
            except BadInputError as error:
                print(f"  {error}; please try again", flush=True)
    return {"data": data, "data_columns": columns, "validation_split": split}, found


def _search_lines(values: dict[str, Any]) -> str:
    """The search budget: given values, else the default said in a comment."""
    from analysis.search.schedule import DEFAULT_SEARCH_BUDGET_PCT

    text = (
        "  # What the search itself may spend (GPU-hours of all workers): search_hours, or\n"
        "  # search_budget_pct of the full run's predicted p50 (default "
        f"{DEFAULT_SEARCH_BUDGET_PCT:g} % once that is an\n"
        "  # hour or more). The study plans its trials into it and ends when it is spent.\n"
    )
    given = [key for key in ("search_hours", "search_budget_pct") if values.get(key) is not None]
    if not given:
        return text + f"  # search_budget_pct: {DEFAULT_SEARCH_BUDGET_PCT:g}\n"
    return text + "".join(f"  {key}: {values[key]:g}\n" for key in given)


def _yaml_value(value: Any) -> str:
    """`value` as one line of YAML (a scalar without the document end `...`)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1000)
    return text.strip().removesuffix("...").strip()


def _data_lines(values: dict[str, Any], found: Findings) -> str:
    """How the data is read and validated: the values given, else what the default does."""
    text = ""
    if values.get("data_columns"):
        text += "# Its columns read as hpo's fields (FIELD=COLUMN).\n"
        text += f"data_columns: {_yaml_value(values['data_columns'])}\n"
    if values.get("validation_split"):
        text += "# Validated on this split; the whole train split trains.\n"
        text += f"validation_split: {values['validation_split']}\n"
    text += found.length
    if found.other_splits:
        text += f"# Its {', '.join(found.other_splits)} split(s) are not read" + (
            ".\n" if values.get("validation_split")
            else ": validation holds out a share of train.\n"
            "# validation_split: NAME validates on one instead.\n"
        )  # fmt: skip
    return text


def render(values: dict[str, Any], found: Findings) -> str:
    """The commented YAML."""

    def value(key: str) -> str:
        return _yaml_value(values[key])

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
        f"data: {value('data')}\n" + _data_lines(values, found) + "\n"
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
        if question.key == "data":
            settled, found = settle_data(args, interactive, values)
            values.update(settled)
            print(f"found: {found.data}; model: {found.model}", flush=True)
            continue
        values[question.key] = ask(question, getattr(args, question.key), interactive, values)
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
