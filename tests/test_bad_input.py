"""The bad-input matrix: one row per way a user can get the input wrong.

Every row: exit code 2, one line on stderr naming the file, field or value, no traceback,
and the stores and files as they were (a content-keyed token cache may appear in the work
dir; no study, MLflow store, JSON, preset or checkpoint does). The commands run in-process
through `run_cli`, the same path `python -m` takes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from common.cli import run_cli
from tests.servers import free_port
from trainers.data.paths import demo_data_path

Row = Callable[[Path, Path], tuple[list[str], str]]  # (tmp, model) -> (argv, expected text)


def _file(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def _jsonl(path: Path, records: list[object]) -> str:
    return _file(path, "".join(json.dumps(r) + "\n" for r in records))


def _space(path: Path, learning_rate: str, lora_r: str = "{choice: [4, 8]}") -> str:
    return _file(
        path,
        f"learning_rate: {learning_rate}\nlora_r: {lora_r}\n"
        "lora_alpha_ratio: {choice: [2]}\nlora_dropout: 0.0\n",
    )


def _parquet(path: Path, rows: list[dict[str, object]]) -> str:
    import datasets

    datasets.disable_progress_bars()  # the test's own writing stays off the checked stderr
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


def _saved(path: Path, rows: list[dict[str, object]]) -> str:
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return str(path)


def _folder(path: Path) -> str:
    path.mkdir()
    return str(path)


def _model_without_config(tmp: Path, model: Path) -> str:
    broken = tmp / "no-config-model"
    shutil.copytree(model, broken)
    (broken / "config.json").unlink()
    return str(broken)


def _study_yaml(text: str, expected: str) -> Row:
    """The row of a study YAML (`--config s.yaml`) holding `text`."""
    return lambda tmp, m: (["--config", _file(tmp / "s.yaml", text)], expected)


_GOOD = {"prompt": "Say hi.", "completion": " hi"}

STUDY_ROWS: dict[str, Row] = {
    "unknown sampler": lambda tmp, m: (["--sampler", "bogus"], "sampler"),
    "unknown pruner": lambda tmp, m: (["--pruner", "bogus"], "pruner"),
    "zero trials": lambda tmp, m: (["--n-trials", "0"], "n_trials"),
    "data file not found": lambda tmp, m: (["--data", str(tmp / "nope.jsonl")], "nope.jsonl"),
    "unknown field in the study YAML": _study_yaml(
        "trial_fraction: 0.1\nbogus_field: 1\n", "bogus_field"
    ),
    "zero budget in the study YAML": _study_yaml("budget:\n  window_hours: 0\n", "window_hours"),
    "study YAML that is not YAML": _study_yaml("sampler: [unclosed\n", "not valid YAML"),
    "space file not found": _study_yaml("space: missing-space.yaml\n", "missing-space.yaml"),
    "malformed JSONL (line number)": lambda tmp, m: (
        ["--data", _file(tmp / "bad.jsonl", json.dumps(_GOOD) + "\n{not json\n")],
        "bad.jsonl:2: not valid JSON",
    ),
    "empty data file": lambda tmp, m: (["--data", _file(tmp / "empty.jsonl", "")], "empty.jsonl"),
    "wrong field types": lambda tmp, m: (
        ["--data", _jsonl(tmp / "types.jsonl", [{"prompt": 5, "completion": ["x"]}])],
        "types.jsonl:1:",
    ),
    "unknown chat role": lambda tmp, m: (
        ["--data", _jsonl(tmp / "chat.jsonl", [{"messages": [{"role": "robot", "content": "x"}]}])],
        "robot",
    ),
    "unknown profile": lambda tmp, m: (["--profiles", "turbo"], "turbo"),
    "inverted range in a space": lambda tmp, m: (
        ["--space", _space(tmp / "inv.yaml", "{loguniform: [1.0e-2, 1.0e-5]}")],
        "learning_rate",
    ),
    "empty range in a space (an empty choice)": lambda tmp, m: (
        ["--space", _space(tmp / "choice.yaml", "{loguniform: [1.0e-5, 1.0e-3]}", "{choice: []}")],
        "lora_r",
    ),
    "zero budget": lambda tmp, m: (["--window-hours", "0"], "window_hours"),
    "negative budget": lambda tmp, m: (["--window-hours", "-2"], "window_hours"),
    "a budget nothing fits (says what would)": lambda tmp, m: (
        # 5,000 epochs in 3 minutes fit on no machine; a few epochs do on any.
        ["--window-hours", "0.05", "--safety-margin-minutes", "0", "--epochs", "5000"],
        "would fit",
    ),
    "unreachable storage URL": lambda tmp, m: (
        ["--storage", f"postgresql://u:topsecret@127.0.0.1:{free_port()}/db"],
        "cannot open storage postgresql://u:***@",
    ),
    "unreachable tracking server at start (--tracking-outage fail)": lambda tmp, m: (
        ["--tracking-uri", f"http://127.0.0.1:{free_port()}", "--tracking-outage", "fail"],
        "127.0.0.1",
    ),
    "unwritable work dir": lambda tmp, m: (
        ["--work-dir", str(Path(_file(tmp / "a-file", "")) / "work")],
        "a-file",
    ),
    "model folder without config.json": lambda tmp, m: (
        ["--model", _model_without_config(tmp, m)],
        "config.json",
    ),
    "data file that is a directory": lambda tmp, m: (
        ["--data", _folder(tmp / "data-dir")],
        "data-dir",
    ),
    # One row per format `datasets` reads; a bad record is named by its row number.
    "Parquet with a bad row (row number)": lambda tmp, m: (
        ["--data", _parquet(tmp / "bad.parquet", [_GOOD, {"prompt": "x", "completion": None}])],
        "bad.parquet: row 2: field 'completion' must be a string",
    ),
    "CSV with an empty cell (row number)": lambda tmp, m: (
        ["--data", _file(tmp / "bad.csv", "prompt,completion\nSay hi., hi\nx,\n")],
        "bad.csv: row 2: field 'completion'",
    ),
    "JSON array with an Alpaca row without output": lambda tmp, m: (
        ["--data", _file(tmp / "bad.json", json.dumps([{"instruction": "Do it.", "output": ""}]))],
        "bad.json: row 1: field 'output' is empty",
    ),
    "ShareGPT with an unknown role": lambda tmp, m: (
        [
            "--data",
            _jsonl(tmp / "share.jsonl", [{"conversations": [{"from": "bot", "value": "x"}]}]),
        ],
        "conversations[0] has unknown role 'bot'",
    ),
    "save_to_disk folder with a bad row": lambda tmp, m: (
        ["--data", _saved(tmp / "saved", [_GOOD, {"text": "no prompt"}])],
        "saved: row 2:",
    ),
    "unsupported data file type": lambda tmp, m: (
        ["--data", _file(tmp / "train.txt", "hello\n")],
        "unsupported file type '.txt'",
    ),
}


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root` but the token cache: size and modification time."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and "cache" not in p.relative_to(root).parts
    }


def _assert_refused(code: int, err: str, expected: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert expected in lines[0], lines[0]
    assert "Traceback" not in err and "topsecret" not in err


@pytest.mark.parametrize("row", list(STUDY_ROWS), ids=list(STUDY_ROWS))
def test_study_refuses(
    row: str, tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpo.study import main

    args, expected = STUDY_ROWS[row](tmp_path, tiny_model_dir)
    base = [
        "--no-progress", "--model", str(tiny_model_dir), "--work-dir", str(tmp_path / "work"),
        "--json", str(tmp_path / "s.json"), "--n-trials", "1",
    ]  # fmt: skip
    before = _snapshot(tmp_path)
    code = run_cli(main, [*base, *args])
    _assert_refused(code, capsys.readouterr().err, expected)
    assert _snapshot(tmp_path) == before


def test_study_name_with_another_space(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study name that exists with a different search space: explain, offer a new name."""
    from hpo.study import main

    base = [
        "--no-progress", "--model", str(tiny_model_dir), "--work-dir", str(tmp_path / "work"),
        "--study-name", "lr", "--n-trials", "1", "--trial-fraction", "0.015",
        "--trial-evals", "2", "--eval-samples", "8", "--pruner", "none", "--rungs", "none",
    ]  # fmt: skip
    assert run_cli(main, [*base, "--profiles", "fast"]) == 0
    capsys.readouterr()
    before = _snapshot(tmp_path)
    code = run_cli(main, [*base, "--profiles", "fast,balanced", "--json", str(tmp_path / "s.json")])
    err = capsys.readouterr().err
    _assert_refused(code, err, "study 'lr' exists with another search space")
    assert "profile" in err and "--study-name lr-2" in err
    assert _snapshot(tmp_path) == before


# ------------------------------------------------------------------------------ full run


def _preset(tmp: Path, model: Path, **changes: object) -> str:
    from trainers.preset import preset_dict
    from trainers.spec import TrainSpec

    spec = TrainSpec(model=str(model), data=str(demo_data_path("prompt_completion")), max_steps=2)
    content = preset_dict(spec, estimate={}, provenance={"study": "s"})
    for key, value in changes.items():
        if value is None:
            content.pop(key)
        else:
            content[key] = value
    return _file(tmp / "preset.yaml", yaml.safe_dump(content))


def _with_checkpoint(tmp: Path) -> str:
    (tmp / "out" / "checkpoint-4").mkdir(parents=True)
    return str(tmp / "out")


TRAIN_ROWS: dict[str, Row] = {
    "--register-model with an empty name": lambda tmp, m: (
        ["--preset", _preset(tmp, m), "--register-model", " "],
        "--register-model needs a name and --tracking-uri",
    ),
    "preset of an unknown version": lambda tmp, m: (
        ["--preset", _preset(tmp, m, version=99)],
        "unsupported preset version 99",
    ),
    "preset with a missing section": lambda tmp, m: (
        ["--preset", _preset(tmp, m, lora=None)],
        "section 'lora'",
    ),
    "model folder without config.json": lambda tmp, m: (
        ["--preset", _preset(tmp, m), "--model", _model_without_config(tmp, m)],
        "config.json",
    ),
    "data file that is a directory": lambda tmp, m: (
        ["--preset", _preset(tmp, m), "--data", str(tmp)],
        "is a directory",
    ),
    "unwritable output folder": lambda tmp, m: (
        ["--preset", _preset(tmp, m), "--output-dir", str(Path(_file(tmp / "a-file", "")) / "o")],
        "a-file",
    ),
    "malformed JSONL (line number)": lambda tmp, m: (
        ["--preset", _preset(tmp, m), "--data", _file(tmp / "bad.jsonl", "{oops\n")],
        "bad.jsonl:1: not valid JSON",
    ),
    "empty data file": lambda tmp, m: (
        ["--preset", _preset(tmp, m), "--data", _file(tmp / "empty.jsonl", "")],
        "empty.jsonl",
    ),
    "an output folder with checkpoints and no --resume": lambda tmp, m: (
        ["--preset", _preset(tmp, m), "--output-dir", _with_checkpoint(tmp)],
        "--resume",
    ),
    "--resume without a checkpoint": lambda tmp, m: (
        ["--preset", _preset(tmp, m), "--resume"],
        "no valid checkpoint",
    ),
}


@pytest.mark.parametrize("row", list(TRAIN_ROWS), ids=list(TRAIN_ROWS))
def test_full_run_refuses(
    row: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """...and leaves no MLflow run behind: the checks come before the tracker."""
    from trainers.train import main

    monkeypatch.chdir(tmp_path)  # the default output folder is relative
    args, expected = TRAIN_ROWS[row](tmp_path, tiny_model_dir)
    tracking = tmp_path / "mlflow.db"
    before = _snapshot(tmp_path)
    code = run_cli(main, [*args, "--quiet", "--tracking-uri", f"sqlite:///{tracking}",
                          "--json", str(tmp_path / "r.json")])  # fmt: skip
    _assert_refused(code, capsys.readouterr().err, expected)
    assert _snapshot(tmp_path) == before
    assert not tracking.exists()  # no MLflow run, not even a store


def test_full_run_output_folder_comes_from_the_preset(tmp_path: Path, tiny_model_dir: Path) -> None:
    from trainers.train import load_run

    first = _preset(tmp_path, tiny_model_dir)
    second = shutil.copy(first, tmp_path / "other.yaml")
    assert load_run(first, {}).spec.output_dir == str(Path("hpo-runs/full/preset"))
    assert load_run(str(second), {}).spec.output_dir == str(Path("hpo-runs/full/other"))
    given = load_run(first, {"output_dir": str(tmp_path / "mine")}).spec.output_dir
    assert given == str(tmp_path / "mine")
    # A preset names its study's work dir: the full run trains there, wherever it is typed;
    # carried to a machine without that folder, in hpo-runs.
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    content = yaml.safe_load(Path(first).read_text())
    content["provenance"]["work_dir"] = str(study_dir)
    third = _file(tmp_path / "third.yaml", yaml.safe_dump(content))
    assert load_run(third, {}).spec.output_dir == str(study_dir / "full" / "third")
    content["provenance"]["work_dir"] = str(tmp_path / "elsewhere")
    fourth = _file(tmp_path / "fourth.yaml", yaml.safe_dump(content))
    assert load_run(fourth, {}).spec.output_dir == str(Path("hpo-runs/full/fourth"))


def test_bad_data_is_refused_before_the_default_model_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --model the study builds its tiny demo model; data that cannot be used is
    refused first: one line, and no model written into the work dir."""
    from common.workdir import WorkDir
    from hpo.study import main

    work = tmp_path / "work"
    argv = ["--no-progress", "--work-dir", str(work), "--n-trials", "1"]
    code = run_cli(main, [*argv, "--data", _file(tmp_path / "empty.jsonl", "")])
    _assert_refused(code, capsys.readouterr().err, "empty.jsonl: no usable records")
    assert not WorkDir(str(work)).models.exists()
