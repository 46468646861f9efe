"""Flags generated from config dataclasses (common/flags.py) and the two CLIs built on them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from common.flags import FieldFlags, add_field_flags


@dataclass(frozen=True)
class Window:
    hours: float = field(default=12.0, metadata={"help": "Window length."})
    limit_gb: float | None = field(default=None, metadata={"help": "Memory limit."})


@dataclass(frozen=True)
class Adapter:
    rank: int = field(default=8, metadata={"help": "Adapter rank.", "flag": "r"})
    targets: str | tuple[str, ...] = field(default="auto", metadata={"help": "Target modules."})


@dataclass(frozen=True)
class Example:
    steps: int = field(default=3, metadata={"help": "Optimizer steps."})
    rate: float = field(default=0.5, metadata={"help": "Learning rate."})
    name: str | None = field(default=None, metadata={"help": "A name."})
    fast: bool = field(default=False, metadata={"help": "Go fast."})
    profiles: tuple[str, ...] | None = field(default=None, metadata={"help": "Profiles."})
    window: Window = field(default_factory=Window, metadata={"help": "The window."})
    adapter: Adapter = field(
        default_factory=Adapter, metadata={"help": "The adapter.", "flag_prefix": "adapter-"}
    )


@dataclass(frozen=True)
class NoHelp:
    steps: int = 3


@dataclass(frozen=True)
class Unparsable:
    sizes: list[int] = field(default_factory=list, metadata={"help": "Sizes."})


def _parser(config: type = Example) -> tuple[argparse.ArgumentParser, FieldFlags]:
    parser = argparse.ArgumentParser(prog="example")
    return parser, add_field_flags(parser, config)


def _given(*argv: str) -> dict[str, Any]:
    parser, flags = _parser()
    return flags.given(parser.parse_args(list(argv)))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--steps", "7"], {"steps": 7}),
        (["--rate", "2.5e-4"], {"rate": 2.5e-4}),
        (["--name", "llama"], {"name": "llama"}),
        (["--fast"], {"fast": True}),
        (["--no-fast"], {"fast": False}),
        (["--profiles", "fast,balanced"], {"profiles": ("fast", "balanced")}),
        (["--profiles", " fast , "], {"profiles": ("fast",)}),
        (["--hours", "2"], {"window": {"hours": 2.0}}),
        (["--limit-gb", "8"], {"window": {"limit_gb": 8.0}}),
        (["--adapter-r", "16"], {"adapter": {"rank": 16}}),
        (["--adapter-targets", "auto"], {"adapter": {"targets": "auto"}}),
        (["--adapter-targets", "q,v"], {"adapter": {"targets": ("q", "v")}}),
        (
            ["--steps", "1", "--hours", "3", "--adapter-r", "4"],
            {"steps": 1, "window": {"hours": 3.0}, "adapter": {"rank": 4}},
        ),
    ],
)
def test_each_field_kind_parses(argv: list[str], expected: dict[str, Any]) -> None:
    assert _given(*argv) == expected


def test_absent_flags_leave_nothing() -> None:
    parser, flags = _parser()
    args = parser.parse_args([])
    assert flags.given(args) == {}
    assert vars(args) == {}


@pytest.mark.parametrize(
    ("flag", "help_text"),
    [
        ("--steps", "Optimizer steps. Default: 3."),
        ("--rate", "Learning rate. Default: 0.5."),
        ("--name", "A name."),
        ("--fast", "Go fast."),
        ("--profiles", "Profiles."),
        ("--hours", "Window length. Default: 12.0."),
        ("--limit-gb", "Memory limit."),
        ("--adapter-r", "Adapter rank. Default: 8."),
        ("--adapter-targets", "Target modules. Default: auto."),
    ],
)
def test_help_comes_from_metadata(flag: str, help_text: str) -> None:
    parser, _ = _parser()
    action = next(a for a in parser._actions if flag in a.option_strings)
    assert action.help == help_text


def test_nested_dataclasses_get_a_help_group() -> None:
    text = " ".join(_parser()[0].format_help().split())
    assert "window: The window." in text and "adapter: The adapter." in text


@pytest.mark.parametrize(
    "argv",
    [["--steps", "many"], ["--rate", "fast"], ["--profiles", ","], ["--fast", "yes"]],
)
def test_unparsable_value_exits_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        _given(*argv)
    assert info.value.code == 2


@pytest.mark.parametrize(
    ("config", "message"), [(NoHelp, "no metadata help"), (Unparsable, "type")]
)
def test_field_without_a_flag_is_a_programming_error(config: type, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        _parser(config)


# The flags of the two commands before they were generated: none may go missing.
STUDY_FLAGS = (
    "--config --model --data --space --objective --trial-fraction --trial-evals --promote "
    "--promote-fraction --eval-samples --eval-max-length --epochs "
    "--full-eval-interval --full-checkpoint-interval --window-hours --safety-margin-minutes "
    "--price-per-hour --max-memory-gb --sampler --pruner --n-trials --timeout --seed --storage "
    "--study-name --heartbeat-seconds --grace-seconds --work-dir --tracking-uri "
    "--experiment-name --device --precision --profiles --json --no-progress"
).split()
TRAIN_FLAGS = (
    "--preset --model --data --output-dir --micro-batch-size --gradient-accumulation-steps "
    "--learning-rate --weight-decay --scheduler --warmup-ratio --max-steps --epochs --max-length "
    "--overflow --validation-fraction --eval-interval --eval-samples --checkpoint-interval "
    "--checkpoint-minutes --keep-checkpoints --precision --device --seed --cache-dir --lora-r "
    "--lora-alpha --lora-dropout --lora-targets --gradient-checkpointing --compile "
    "--skip-bad-lines --resume --window-hours --safety-margin-minutes --report-every "
    "--no-recovery --max-rollbacks --rollback-lr-factor --tracking-uri --experiment-name --json "
    "--quiet"
).split()


def _cli_parser(command: str) -> argparse.ArgumentParser:
    if command == "study":
        from hpo.study import build_parser
    else:
        from trainers.train import build_parser
    return build_parser()[0]


@pytest.mark.parametrize(("command", "expected"), [("study", STUDY_FLAGS), ("train", TRAIN_FLAGS)])
def test_cli_keeps_every_flag_and_documents_it(command: str, expected: list[str]) -> None:
    actions = _cli_parser(command)._actions
    present = {option for action in actions for option in action.option_strings}
    assert not set(expected) - present
    assert all(action.help for action in actions)


def test_study_flags_override_only_what_they_name(tmp_path: Path) -> None:
    from hpo.config import load_config
    from hpo.study import build_parser

    yaml_file = tmp_path / "study.yaml"
    yaml_file.write_text("n_trials: 5\nbudget:\n  window_hours: 2\n  price_per_hour: 3\n")
    parser, flags = build_parser()
    argv = ["--window-hours", "4", "--profiles", "fast,balanced", "--seed", "9"]
    config = load_config(str(yaml_file), flags.given(parser.parse_args(argv)))
    assert config.budget.window_hours == 4.0 and config.budget.price_per_hour == 3.0
    assert config.profiles == ("fast", "balanced") and config.seed == 9
    assert config.n_trials == 5 and config.sampler == "tpe"


def test_train_flags_build_the_full_run_spec() -> None:
    from trainers.train import build_parser, load_run, with_full_run_defaults

    parser, flags = build_parser()
    argv = ["--model", "m", "--data", "d.jsonl", "--lora-r", "4", "--lora-targets", "q,v"]
    given = flags.given(parser.parse_args([*argv, "--max-rollbacks", "1", "--compile"]))
    spec = with_full_run_defaults(load_run(None, given).spec, given)
    assert spec.lora.r == 4 and spec.lora.target_modules == ("q", "v") and spec.compile
    assert spec.recovery.enabled and spec.recovery.max_rollbacks == 1  # on for a full run
    assert spec.checkpoint_minutes == 30.0  # no checkpoint setting: every 30 min

    given = flags.given(parser.parse_args([*argv, "--no-recovery", "--checkpoint-interval", "5"]))
    spec = with_full_run_defaults(load_run(None, given).spec, given)
    assert not spec.recovery.enabled and spec.checkpoint_minutes == 0.0


def test_train_flags_merge_into_a_preset(tmp_path: Path) -> None:
    import yaml

    from trainers.preset import preset_dict
    from trainers.spec import LoraSpec, RecoverySpec, TrainSpec
    from trainers.train import build_parser, load_run

    stored = TrainSpec(
        model="m",
        data="d.jsonl",
        lora=LoraSpec(r=16, alpha=32.0),
        recovery=RecoverySpec(max_rollbacks=2, lr_factor=0.25),
        learning_rate=1e-4,
    )
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(preset_dict(stored, estimate={}, provenance={})))
    parser, flags = build_parser()
    args = parser.parse_args(["--preset", str(path), "--lora-r", "8", "--max-rollbacks", "5"])
    spec = load_run(args.preset, flags.given(args)).spec
    assert (spec.lora.r, spec.lora.alpha) == (8, 32.0)
    assert (spec.recovery.max_rollbacks, spec.recovery.lr_factor) == (5, 0.25)
    assert spec.learning_rate == 1e-4
