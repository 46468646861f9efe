"""A preset states what its full run does: recovery, early stopping and checkpoint cadence.

The preset file is written with `preset_dict` and read back the way `trainers.train` reads it
(`load_run`), so what a user reads in `training` is what the run gets. The whole round trip
through a study's export and a real run is in `tests/test_trial_runs.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from common.errors import BadInputError
from trainers.preset import (
    DEFAULT_CHECKPOINT_MINUTES,
    DEFAULT_EARLY_STOPPING_PATIENCE,
    PRESET_VERSION,
    changes_the_loss,
    departures,
    preset_dict,
)
from trainers.spec import RecoverySpec, TrainSpec
from trainers.train import build_parser, load_run

# A trial's own settings: no recovery, no early stopping, no checkpoint cadence of its own.
TRIAL_LIKE = TrainSpec(model="m", data="d.jsonl", recovery=RecoverySpec(max_rollbacks=2))


def _write(tmp_path: Path, content: dict[str, Any]) -> Path:
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return path


def _run_spec(*argv: str) -> TrainSpec:
    parser, flags = build_parser()
    args = parser.parse_args(list(argv))
    return load_run(args.preset, flags.given(args)).spec


def test_a_preset_holds_the_full_runs_settings_not_the_trials(tmp_path: Path) -> None:
    content = preset_dict(TRIAL_LIKE, estimate={}, provenance={})
    training = content["training"]
    assert content["version"] == PRESET_VERSION
    assert training["recovery"] == {**training["recovery"], "enabled": True, "max_rollbacks": 2}
    assert training["early_stopping_patience"] == DEFAULT_EARLY_STOPPING_PATIENCE
    assert training["checkpoint_minutes"] == DEFAULT_CHECKPOINT_MINUTES
    spec = _run_spec("--preset", str(_write(tmp_path, content)))
    for name in ("recovery", "early_stopping_patience", "checkpoint_minutes"):
        assert spec.to_dict()[name] == training[name], name


def test_a_checkpoint_cadence_in_steps_is_kept() -> None:
    spec = TrainSpec(model="m", data="d.jsonl", checkpoint_interval=40)
    training = preset_dict(spec, estimate={}, provenance={})["training"]
    assert (training["checkpoint_interval"], training["checkpoint_minutes"]) == (40, 0.0)


def test_what_a_user_sets_in_the_preset_is_what_runs(tmp_path: Path) -> None:
    content = preset_dict(TRIAL_LIKE, estimate={}, provenance={})
    content["training"]["recovery"]["enabled"] = False
    content["training"]["early_stopping_patience"] = 0
    spec = _run_spec("--preset", str(_write(tmp_path, content)))
    assert not spec.recovery.enabled and spec.early_stopping_patience == 0


def test_flags_override_what_the_preset_states(tmp_path: Path) -> None:
    path = _write(tmp_path, preset_dict(TRIAL_LIKE, estimate={}, provenance={}))
    spec = _run_spec("--preset", str(path), "--no-recovery", "--early-stopping-patience", "0")
    assert not spec.recovery.enabled and spec.early_stopping_patience == 0
    spec = _run_spec("--preset", str(path), "--max-rollbacks", "7")
    assert spec.recovery.enabled and spec.recovery.max_rollbacks == 7


def test_a_version_1_preset_still_gets_the_full_run_defaults(tmp_path: Path) -> None:
    # Version 1 wrote the trial's values (recovery off, patience 0, no cadence): they were
    # never what its full run did, and its full run does not change now.
    content = preset_dict(TRIAL_LIKE, estimate={}, provenance={})
    content["version"] = 1
    content["training"].update(
        recovery={**content["training"]["recovery"], "enabled": False},
        early_stopping_patience=0,
        checkpoint_minutes=0.0,
    )
    spec = _run_spec("--preset", str(_write(tmp_path, content)))
    assert spec.recovery.enabled and spec.recovery.max_rollbacks == 2
    assert spec.early_stopping_patience == DEFAULT_EARLY_STOPPING_PATIENCE
    assert spec.checkpoint_minutes == DEFAULT_CHECKPOINT_MINUTES


@pytest.mark.parametrize("version", [0, 3, "2", True, None])
def test_an_unknown_version_is_refused(tmp_path: Path, version: object) -> None:
    content = preset_dict(TRIAL_LIKE, estimate={}, provenance={})
    content["version"] = version
    with pytest.raises(BadInputError, match="unsupported preset version"):
        _run_spec("--preset", str(_write(tmp_path, content)))


def test_what_a_run_changes_over_its_preset_decides_what_it_is_compared_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "d.jsonl").write_text("")
    spec = TrainSpec(
        model=str(tmp_path / "m"), data=str(tmp_path / "d.jsonl"),
        micro_batch_size=4, gradient_accumulation_steps=4,
    )  # fmt: skip
    path = _write(tmp_path, preset_dict(spec, estimate={}, provenance={}))
    own = _run_spec("--preset", str(path))
    monkeypatch.chdir(tmp_path)

    def changed(*flags: str) -> dict[str, list[Any]]:
        return departures(own, _run_spec("--preset", str(path), *flags))

    # Where it writes, its seed, how it recovers, the same data named another way: the run.
    assert changed("--output-dir", "elsewhere", "--seed", "3", "--data", "./d.jsonl") == {}
    assert changed("--no-recovery", "--early-stopping-patience", "0") == {}
    # Another GPU count at the preset's effective batch: another duration, the same loss.
    on_two = changed("--gpus", "2")
    assert on_two == {"gpus": [1, 2], "gradient_accumulation_steps": [4, 2]}
    assert changes_the_loss(on_two) == []
    assert changes_the_loss(changed("--gradient-checkpointing", "--eval-interval", "7")) == []
    # A smoke test, another rate or rank, another batch: not the run its estimate predicted.
    assert changed("--max-steps", "20") == {"max_steps": [None, 20]}
    assert changes_the_loss(changed("--max-steps", "20")) == ["max_steps"]
    assert changes_the_loss(changed("--learning-rate", "0.01", "--lora-r", "4")) == [
        "learning_rate", "lora.r",
    ]  # fmt: skip
    assert changes_the_loss(changed("--micro-batch-size", "2")) == [
        "effective_batch_size",
    ]  # fmt: skip
    (tmp_path / "other.jsonl").write_text("")
    assert changes_the_loss(changed("--data", "other.jsonl")) == ["data"]


def test_a_preset_only_the_flags_make_valid_is_not_the_run_it_predicted(tmp_path: Path) -> None:
    from trainers.train import _departures

    content = preset_dict(TRIAL_LIKE, estimate={}, provenance={})
    content["training"]["micro_batch_size"] = 0  # edited by hand
    path = _write(tmp_path, content)
    run = _run_spec("--preset", str(path), "--micro-batch-size", "4")
    assert changes_the_loss(_departures(str(path), run)) == ["preset"]


def test_the_validation_split_goes_with_the_preset(tmp_path: Path) -> None:
    """A study that validated on the data's own split writes it into the preset; the run
    reads it back into its data, and a run given another one is not the preset's run."""
    spec = TrainSpec(model="m", data="hub", validation_split="test", data_columns="output=response")
    content = preset_dict(spec, estimate={}, provenance={})
    assert content["data"]["validation_split"] == "test"
    assert content["data"]["data_columns"] == "output=response"
    path = _write(tmp_path, content)
    ran = _run_spec("--preset", str(path))
    assert ran.validation_split == "test" and ran.data_spec().validation_split == "test"
    assert ran.data_spec().data_columns == "output=response"
    other = _run_spec("--preset", str(path), "--validation-split", "validation")
    departed = departures(ran, other)
    assert departed == {"validation_split": ["test", "validation"]}
    assert changes_the_loss(departed) == ["validation_split"]
