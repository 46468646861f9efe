"""A study trains the user's samples whole: the shipped profiles name no max_length, so every
profile trains at the study's (`--max-length`, else the data's p99 token length, within the
model's context); a profile of a space file that names one cuts there, and the study says
how many samples each length cuts. Until 2026-12-07 the shipped profiles cut every sample at
128, 256 or 512 tokens whatever the data, silently.

Real tokenization with the tiny model's tokenizer, a real study on SQLite and MLflow.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from common.errors import BadInputError
from hpo.config import StudyConfig
from hpo.prepare import prepare
from hpo.study_space import check_same_space, space_record
from search_spaces import load_space
from tests.cli import run_module
from tests.configs import short_study
from trainers.data.dataset import DataSpec, load_tokenized, long_tail_length
from trainers.model.lora import load_tokenizer

WORDS = "the quick brown fox jumps over a lazy dog while seven owls watch it".split()


def long_records(path: Path, n: int = 120, *, long_prompts: int = 0) -> Path:
    """Prompt/completion records of 50-115 words, about 200-450 tokens of the tiny model (its
    context is 512); the first `long_prompts` of them with a prompt of 400 words, longer
    than any length they are cut at."""
    rng = np.random.default_rng(0)
    with path.open("w", encoding="utf-8") as out:
        for i in range(n):
            words = int(rng.integers(50, 115))
            prompt_words = 400 if i < long_prompts else 8
            prompt = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(prompt_words))
            completion = " " + " ".join(WORDS[(i * 3 + k) % len(WORDS)] for k in range(words))
            out.write(json.dumps({"prompt": prompt + ":", "completion": completion}) + "\n")
    return path


def whole_lengths(model: Path, data: Path, cache: Path) -> list[int]:
    spec = DataSpec(path=str(data), max_length=10**6, cache_dir=str(cache))
    return list(load_tokenized(spec, load_tokenizer(str(model))).stats.lengths)


def test_the_shipped_profiles_train_the_samples_whole(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    data = long_records(tmp_path / "long.jsonl")
    prepared = prepare(
        StudyConfig(model=str(tiny_model_dir), data=str(data), work_dir=str(tmp_path / "w"))
    )
    lengths = whole_lengths(tiny_model_dir, data, tmp_path / "cache")
    assert prepared.context is not None and max(lengths) < prepared.context
    expected = long_tail_length(lengths, prepared.context)
    # Above every length a shipped profile cut at before (128, 256 and 512 would cut most).
    assert np.percentile(lengths, 50) > 256 and expected > max(lengths) * 0.9
    assert prepared.max_length == prepared.data_length == expected == prepared.eval_max_length
    assert {p.length() for p in prepared.space.profiles.values()} == {expected}
    assert set(prepared.dataset_stats) == {expected}
    (cut,) = prepared.cuts
    assert cut.study and not cut.profiles and cut.samples == len(lengths)
    assert cut.cut == sum(n > expected for n in lengths) <= 0.02 * len(lengths)
    line = cut.line(prepared)
    assert line.startswith(f"training at max_length {expected:,} tokens, the data's p99")
    assert f"{cut.cut:,} of {len(lengths):,} samples cut" in line


def test_a_given_length_and_a_profiles_own_and_what_they_cut(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    data = long_records(tmp_path / "long.jsonl", long_prompts=10)
    space = tmp_path / "space.yaml"
    raw = yaml.safe_load(resources.files("search_spaces").joinpath("default.yaml").read_text())
    raw["profiles"] = {
        "short": {"micro_batch_size": [2], "gradient_accumulation_steps": [1],
                  "gradient_checkpointing": False, "max_length": 64},
        "whole": {"micro_batch_size": [2], "gradient_accumulation_steps": [1],
                  "gradient_checkpointing": False},
    }  # fmt: skip
    raw["profile"] = {"choice": ["short", "whole"]}
    space.write_text(yaml.safe_dump(raw), encoding="utf-8")
    config = StudyConfig(
        model=str(tiny_model_dir), data=str(data), work_dir=str(tmp_path / "w"),
        space=str(space), max_length=200,
    )  # fmt: skip
    prepared = prepare(config)
    lengths = whole_lengths(tiny_model_dir, data, tmp_path / "cache")
    assert prepared.max_length == 200 and prepared.length_given
    assert prepared.space.profiles["short"].length() == 64
    assert prepared.space.profiles["whole"].length() == 200
    assert not prepared.space.profiles["short"].length_from_study
    assert prepared.space.profiles["whole"].length_from_study
    # The validation length stays the data's: every run is scored on the same tokens.
    assert prepared.eval_max_length == long_tail_length(lengths, prepared.context or 0) > 200
    short, whole = prepared.cuts
    assert (short.max_length, short.profiles, short.study) == (64, ("short",), False)
    assert (whole.max_length, whole.profiles, whole.study) == (200, (), True)
    assert short.cut == sum(n > 64 for n in lengths) and whole.cut == sum(n > 200 for n in lengths)
    # The ten prompts of 400 words leave nothing to learn at 64 or 200 tokens.
    assert short.without_target == whole.without_target == 10
    assert "profile 'short' names it: " in short.line(prepared)
    assert "left with no token to learn" in short.line(prepared)
    assert whole.line(prepared).startswith("training at max_length 200 tokens, the study's")
    beyond = StudyConfig(
        model=str(tiny_model_dir), data=str(data), work_dir=str(tmp_path / "w2"), max_length=4096
    )
    with pytest.raises(BadInputError, match=r"max_length: 4,096 tokens is beyond the model's"):
        prepare(beyond)
    assert not (tmp_path / "w2").exists()  # refused before anything is tokenized or cached


def test_a_study_trains_and_exports_at_the_datas_length(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    data = long_records(tmp_path / "long.jsonl", n=60)
    work = tmp_path / "w"
    config = short_study(work, tiny_model_dir, {"data": str(data), "trial_fraction": 0.05})
    expected = long_tail_length(
        whole_lengths(tiny_model_dir, data, tmp_path / "cache"), 512
    )
    proc = run_module(
        "hpo.study", "--no-progress", "--model", str(tiny_model_dir), "--data", str(data),
        "--work-dir", str(work), "--n-trials", "1", "--trial-fraction", "0.05",
        "--trial-evals", "2", "--eval-samples", "4", "--profiles", "fast", "--pruner", "none",
        "--rungs", "none", "--reference-fraction", "0", cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"training at max_length {expected:,} tokens, the data's p99" in proc.stdout
    study = optuna.load_study(study_name=config.study_name, storage=f"sqlite:///{work}/optuna.db")
    (trial,) = study.trials
    assert trial.user_attrs["max_length"] == expected
    preset = yaml.safe_load((work / "presets" / f"{config.study_name}.yaml").read_text())
    assert preset["data"]["max_length"] == expected


def test_a_resumed_study_at_another_length_names_the_one_that_continues_it(
    tmp_path: Path,
) -> None:
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    study = optuna.create_study(study_name="s", storage=storage)
    space = load_space()
    check_same_space(study, space_record(space.with_max_length(1184), None))
    check_same_space(study, space_record(space.with_max_length(1184), None))  # the same: fine
    with pytest.raises(BadInputError, match=r"continue it with --max-length 1184, or run a new"):
        check_same_space(study, space_record(space.with_max_length(1200), None))
    resolved = space.with_max_length(1184)
    domains = {k: v for k, v in resolved.domains.items() if k != "lora_dropout"}
    other = dataclasses.replace(resolved, domains=domains)
    with pytest.raises(BadInputError, match=r"another search space \(differs in: lora_dropout"):
        check_same_space(study, space_record(other, None))


def test_a_study_of_profiles_at_their_own_lengths_is_told_how_to_continue(
    tmp_path: Path,
) -> None:
    """A study made before the shipped profiles took the study's length trained each at its
    own (fast 128, balanced and memory_efficient 256, quality 512): no one --max-length gives
    those back, and the refusal said "continue it with --max-length 128, 256, 512". It names
    each profile's length and the space file that continues it; that file does."""
    profiles = tmp_path / "profiles.yaml"
    old = {"fast": 128, "balanced": 256, "quality": 512, "memory_efficient": 256}
    shipped = yaml.safe_load(
        resources.files("search_spaces").joinpath("profiles.yaml").read_text(encoding="utf-8")
    )
    for name, length in old.items():
        shipped["profiles"][name]["max_length"] = length
    profiles.write_text(yaml.safe_dump(shipped), encoding="utf-8")
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'o.db'}")
    before = load_space(profiles_path=profiles)
    check_same_space(study, space_record(before, None))
    with pytest.raises(BadInputError) as refused:
        check_same_space(study, space_record(load_space().with_max_length(16), None))
    message = str(refused.value)
    assert "--max-length 128" not in message and "128, 256" not in message
    assert "each profile at its own max_length (balanced 256, fast 128, " in message
    assert "memory_efficient 256, quality 512), this run at 16: continue it with a space file" in (
        message
    )
    # What it says continues the study: the same space with those lengths, from a file.
    check_same_space(study, space_record(load_space(profiles_path=profiles).with_max_length(16), None))


def test_the_plan_of_a_data_file_takes_the_length_a_study_would(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from analysis.planning.inputs import lengths_from_data

    data = long_records(tmp_path / "long.jsonl")
    out = tmp_path / "plan.json"
    proc = run_module(
        "analysis.plan", "--model-config", "llama-3.1-8b", "--gpu", "H100", "--data", str(data),
        "--tokenizer", str(tiny_model_dir), "--json", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    train, _ = lengths_from_data(str(data), max_length=10**6, tokenizer_dir=str(tiny_model_dir))
    expected = long_tail_length(train, 131072)  # Llama-3.1's context
    plan = json.loads(out.read_text())
    assert plan["plan"]["run"]["max_length"] == expected != 512  # 512: the plan's own default
    assert {row["run"]["max_length"] for row in plan["profiles"].values()} == {expected}
    # --max-length is the user's: taken as given.
    given = run_module(
        "analysis.plan", "--model-config", "llama-3.1-8b", "--gpu", "H100", "--data", str(data),
        "--tokenizer", str(tiny_model_dir), "--max-length", "256", "--json", str(out),
        cwd=tmp_path,
    )  # fmt: skip
    assert given.returncode == 0, given.stderr[-2000:]
    assert json.loads(out.read_text())["plan"]["run"]["max_length"] == 256
