"""`python -m hpo.init`: asked through a pseudo-terminal, and without one (flags, --yes).

The file it writes is run by `python -m hpo.study --config` (one real trial on the tiny
model), whose trial records the base and the applied learning rate of the default space's
scaling.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pexpect
import pytest
import yaml

from hpo.config import load_config
from search_spaces import load_space
from tests.cli import ROOT, run_module
from trainers.data.paths import demo_data_path

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def _init(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("hpo.init", *args, env=ENV, stdin=subprocess.DEVNULL, timeout=120)


def test_a_terminal_session_asks_again_after_bad_answers(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "study.yaml"
    child = pexpect.spawn(
        sys.executable,
        ["-m", "hpo.init", "--out", str(out)],
        cwd=str(ROOT),
        env=ENV,
        encoding="utf-8",
        timeout=90,
    )
    child.expect("Model folder")
    child.sendline(str(tmp_path / "nowhere"))
    child.expect("not a model folder.*try again")
    child.expect("Model folder")
    child.sendline(str(tiny_model_dir))
    child.expect("Training data")
    child.sendline(str(demo_data_path("prompt_completion")))
    child.expect(r"found: 3,000 prompt_completion samples; tokens per sample p50 \d+")
    child.expect(r"Window for the full run, in hours \[12\]")
    child.sendline("-3")
    child.expect("window_hours: must be > 0, but got '-3'")
    child.expect("Window")
    child.sendline("0.5")
    child.expect(r"Safety margin.*\[30\]")
    child.sendline("")  # the default, 30 min, is the whole window
    child.expect(r"must be shorter than the window \(0.5 h\)")
    child.sendline("5")
    child.expect("price per hour")
    child.sendline("2.5")
    child.expect(r"GPUs the full run trains on.*\[1\]")
    child.sendline("1.5")
    child.expect("gpus_per_run: expected a whole number, but got '1.5'")
    child.expect("GPUs the full run")
    child.sendline("2")
    child.expect("Profiles")
    child.sendline("fast,turbo")
    child.expect("unknown turbo")
    child.sendline("fast")
    child.expect("python -m hpo.study --config " + str(out))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    config = load_config(str(out))
    assert config.model == str(tiny_model_dir.resolve())
    assert (config.budget.window_hours, config.budget.safety_margin_minutes) == (0.5, 5.0)
    assert config.budget.price_per_hour == 2.5 and tuple(config.profiles or ()) == ("fast",)
    assert config.budget.gpus_per_run == 2
    text = out.read_text(encoding="utf-8")
    assert "# The training data: 3,000 prompt_completion samples" in text
    assert "# Hardware found: cpu" in text


def test_without_a_terminal_a_missing_answer_exits_2_and_writes_nothing(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "study.yaml"
    proc = _init("--model", str(tiny_model_dir), "--out", str(out))
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: data: no terminal to ask in; pass --data"
    bad = _init(
        "--yes", "--model", str(tiny_model_dir), "--data", str(demo_data_path("text")),
        "--window-hours", "1", "--safety-margin-minutes", "90", "--out", str(out),
    )  # fmt: skip
    assert bad.returncode == 2 and "safety_margin_minutes" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_yes_writes_a_config_that_hpo_study_runs(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "study.yaml"
    made = _init(
        "--yes", "--model", str(tiny_model_dir), "--data",
        str(demo_data_path("prompt_completion")), "--profiles", "fast", "--out", str(out),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert f"python -m hpo.study --config {out}" in made.stdout
    written = out.read_text(encoding="utf-8")
    assert yaml.safe_load(written)["budget"]["window_hours"] == 12.0
    # The training length a study takes from this data, said where the user can set it.
    found = re.search(r"p99 token length,\n# (\d+) here, which cuts ([\d,]+) of ([\d,]+) ", written)
    assert found and f"\n# max_length: {found[1]}\n" in written, written
    cut, samples = (int(found[i].replace(",", "")) for i in (2, 3))
    assert samples == 3000 and cut <= 0.02 * samples
    work, result = tmp_path / "work", tmp_path / "result.json"
    study = run_module(
        "hpo.study", "--config", str(out), "--work-dir", str(work),
        "--n-trials", "1", "--trial-fraction", "0.03", "--trial-evals", "2",
        "--eval-samples", "16", "--sampler", "random", "--json", str(result),
        env=ENV,
    )  # fmt: skip
    assert study.returncode == 0, study.stderr[-2000:]
    summary = json.loads(result.read_text(encoding="utf-8"))
    assert summary["states"]["complete"] == 1
    (trial,) = optuna.load_study(
        study_name=summary["study_name"], storage=f"sqlite:///{work / 'optuna.db'}"
    ).trials
    attrs = trial.user_attrs
    assert attrs["max_length"] == int(found[1])
    batch = attrs["micro_batch_size"] * attrs["gradient_accumulation_steps"]
    space = load_space()
    assert attrs["learning_rate_scaling"] == space.learning_rate_scaling
    assert attrs["base_learning_rate"] == pytest.approx(trial.params["learning_rate"])
    assert attrs["learning_rate"] == pytest.approx(
        attrs["base_learning_rate"] * space.learning_rate_factor(batch)
    )


# The budget's answers as flags: the tests below ask only about the data.
_BUDGET = ("--window-hours", "2", "--safety-margin-minutes", "10", "--price-per-hour", "1",
           "--gpus-per-run", "1")  # fmt: skip


def _spawn_init(*args: str) -> pexpect.spawn:
    return pexpect.spawn(
        sys.executable, ["-m", "hpo.init", *args], cwd=str(ROOT), env=ENV, encoding="utf-8",
        timeout=90,
    )  # fmt: skip


def _dolly_folder(folder: Path) -> Path:
    """A Hub-style data folder with Dolly's columns: train, validation and test splits."""
    folder.mkdir()
    for split, count in (("train", 40), ("validation", 8), ("test", 6)):
        rows = (
            {"instruction": f"Name the number {i}.", "context": "", "response": f"{i}, {split}"}
            for i in range(count)
        )
        (folder / f"{split}.jsonl").write_text(
            "".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8"
        )
    return folder


def test_a_terminal_asks_for_columns_and_a_split_only_where_the_data_needs_them(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out, data = tmp_path / "study.yaml", _dolly_folder(tmp_path / "dolly")
    child = _spawn_init("--out", str(out), "--profiles", "fast", *_BUDGET)
    child.expect("Model folder")
    child.sendline(str(tiny_model_dir))
    child.expect("Training data")
    child.sendline(str(data))
    child.expect("missing field 'output'.*try again")
    child.expect("Columns to read as hpo's fields")
    child.sendline("output")
    child.expect("must be FIELD=COLUMN pairs.*try again")
    child.expect("Columns to read")
    child.sendline("output=respons, input=context")  # a typo is named as the column
    child.expect(r"no column 'respons' \(--data-columns output=respons\); the record's columns")
    child.expect("try again")
    child.expect("Columns to read")
    child.sendline("output=response, input=context")
    child.expect(r"Split to validate on \(validation, test; 'none'.*\) \[validation\]")
    assert "are not read" not in child.before  # asked, not also warned of
    child.sendline("")
    child.expect(r"found: 48 alpaca samples.*; 8 of them its validation split, which validates")
    child.expect("python -m hpo.study --config " + str(out))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    config = load_config(str(out))
    assert config.data_columns == "output=response, input=context"
    assert config.validation_split == "validation"
    text = out.read_text(encoding="utf-8")
    assert "# Its test split(s) are not read" in text


def test_a_split_that_cannot_validate_is_asked_again(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A saved DatasetDict whose test split holds text records beside prompt/completion
    ones: choosing it asks again, with the reason; 'none' holds out a share of train."""
    import datasets

    out, saved = tmp_path / "study.yaml", tmp_path / "saved"
    prompts = [{"prompt": f"What is {i} + {i}?", "completion": f" {2 * i}"} for i in range(30)]
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(prompts),
         "test": datasets.Dataset.from_list([{"text": f"plain {i}"} for i in range(5)])}
    ).save_to_disk(str(saved))  # fmt: skip
    child = _spawn_init(
        "--out", str(out), "--model", str(tiny_model_dir), "--data", str(saved), "--profiles",
        "all", *_BUDGET,
    )  # fmt: skip
    child.expect(r"Split to validate on \(test; 'none'.*\) \[none\]")
    child.sendline("test")
    child.expect("its test split holds text records.*try again")
    child.expect("Split to validate on")
    child.sendline("none")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert load_config(str(out)).validation_split is None


def test_a_terminal_asks_for_another_file_where_no_columns_are_given(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out, data = tmp_path / "study.yaml", _dolly_folder(tmp_path / "dolly")
    child = _spawn_init("--out", str(out), "--model", str(tiny_model_dir), "--yes")
    child.expect(pexpect.EOF)  # --yes: nothing is asked, a terminal or not
    child.close()
    assert child.exitstatus == 2
    child = _spawn_init(
        "--out", str(out), "--model", str(tiny_model_dir), "--data", str(data), "--profiles",
        "all", *_BUDGET,
    )  # fmt: skip
    child.expect("missing field 'output'.*try again")
    child.expect("Columns to read")
    child.sendline("")  # no columns: another file
    child.expect("Training data")
    child.sendline(str(demo_data_path("prompt_completion")))
    child.expect(r"found: 3,000 prompt_completion samples")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    config = load_config(str(out))
    assert config.data == str(demo_data_path("prompt_completion").resolve())
    assert config.data_columns is None and config.validation_split is None


def test_flags_read_the_columns_and_split_and_a_split_the_data_lacks_exits_2(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out, data = tmp_path / "study.yaml", _dolly_folder(tmp_path / "dolly")
    common = ("--yes", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(out))
    plain = _init(*common)
    assert plain.returncode == 2 and not out.exists()
    assert (
        plain.stderr.strip()
        .splitlines()[0]
        .endswith(
            "missing field 'output' (--data-columns output=COLUMN reads another column as it)"
        )
    )
    columns = ("--data-columns", "output=response,input=context")
    lacking = _init(*common, *columns, "--validation-split", "dev")
    assert lacking.returncode == 2 and not out.exists()
    assert "without a 'dev' split (it has train, validation, test)" in lacking.stderr
    made = _init(*common, *columns, "--validation-split", "test")
    assert made.returncode == 0, made.stderr
    assert "found: 46 alpaca samples" in made.stdout
    assert "6 of them its test split, which validates" in made.stdout
    config = load_config(str(out))
    assert (config.data_columns, config.validation_split) == (columns[1], "test")
    assert "# Its validation split(s) are not read" in out.read_text(encoding="utf-8")
