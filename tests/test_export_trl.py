"""`hpo.export --format trl`: the written config runs in TRL's own `trl sft` entry point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pytest
import yaml

from hpo.export_formats import write_format
from trainers.data.paths import demo_data_path
from trainers.preset import preset_dict
from trainers.spec import TrainSpec

ESTIMATE = {
    "duration_hours": {"p10": 0.5, "p50": 1.0, "p90": 1.5},
    "breakdown_hours": {"startup": 0.05, "data_loading": 0.05, "train": 0.85, "eval": 0.05},
    "full_run_steps": 1200,
    "window_hours": 2.0,
    "hardware": {"device_kind": "cpu", "device_name": "cpu", "precision": "fp32"},
}
PROVENANCE = {"study": "demo-study", "trial": 7, "value": 1.23, "mlflow_run_id": "abc123"}


def _preset(model: Path, data: Path, **training: Any) -> dict[str, Any]:
    spec = TrainSpec(model=str(model), data=str(data), **training)
    return preset_dict(spec, estimate=ESTIMATE, provenance=PROVENANCE)


def _sft_args(config: Path, *overrides: str) -> tuple[Any, ...]:
    """TRL's own parser of `trl sft`, as its command calls it: the file's keys it does not
    know go to `accelerate launch` (`_launch_args`), and may only be that launcher's."""
    return _parsed(config, *overrides)[:4]


def _launch_args(config: Path) -> list[str]:
    return _parsed(config)[4]


def _parsed(config: Path, *overrides: str) -> tuple[Any, ...]:
    from trl.scripts.sft import make_parser

    *parsed, from_file, from_cli = make_parser(prog="trl sft").parse_args_and_config(
        ["--config", str(config), *overrides],
        return_remaining_strings=True, separate_remaining_strings=True,
    )  # fmt: skip
    assert from_cli == []
    launcher = {"--num_processes"}  # accelerate launch's, as `trl sft` passes them on
    assert set(from_file[::2]) <= launcher, from_file
    return (*parsed, from_file)


def test_native_data_is_referenced_and_the_preset_carried(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = demo_data_path("prompt_completion")
    preset = _preset(
        tiny_model_dir, data, micro_batch_size=4, gradient_accumulation_steps=3,
        learning_rate=2e-4, scheduler="cosine", warmup_ratio=0.05, epochs=2.0,
        lora={"r": 16, "alpha": 32.0, "dropout": 0.1, "use_rslora": True}, max_length=96,
    )  # fmt: skip
    written = write_format("trl", preset, tmp_path / "trl.yaml")
    assert written == [tmp_path / "trl.yaml"]  # no converted copy of data TRL reads itself
    text = written[0].read_text()
    assert "study demo-study, trial 7" in text and "p50 1 h" in text
    script, sft, model, mixture = _sft_args(written[0])
    assert mixture.datasets[0].data_files == str(data.resolve())
    assert (model.lora_r, model.lora_alpha, model.lora_dropout) == (16, 32.0, 0.1)
    assert model.use_rslora and model.lora_target_modules == "all-linear"
    assert (sft.per_device_train_batch_size, sft.gradient_accumulation_steps) == (4, 3)
    # The estimate's steps: the preset's 2 epochs over hpo's training split.
    assert (sft.learning_rate, sft.max_steps, sft.max_length) == (2e-4, 1200, 96)
    assert "max_steps 1,200: the preset's 2 epoch(s)" in text
    assert sft.lr_scheduler_type.value == "cosine" and sft.warmup_steps == 0.05
    # Off as in the preset, though TRL's default is on; the name every transformers 5.x reads.
    assert sft.gradient_checkpointing is False
    assert getattr(sft, "activation_checkpointing", False) is False
    on = _preset(tiny_model_dir, data, micro_batch_size=4, gradient_checkpointing=True)
    _, sft_on, _, _ = _sft_args(write_format("trl", on, tmp_path / "on.yaml")[0])
    assert sft_on.gradient_checkpointing is True
    assert sft_on.gradient_checkpointing_kwargs == {"use_reentrant": False}  # as trainers.train
    assert sft.gradient_checkpointing_kwargs is None
    assert getattr(sft_on, "activation_checkpointing", True) is True
    assert not sft.bf16 and not sft.fp16  # the study measured fp32
    assert not sft.packing
    # 30 checkpoint minutes at the estimate's 3 s per step.
    assert (sft.save_strategy.value, sft.save_steps) == ("steps", 600)
    # One process, whatever the node: accelerate launch would start one per GPU it sees.
    assert _launch_args(written[0]) == ["--num_processes", "1"]
    assert "CUDA_VISIBLE_DEVICES set to one" in text
    four = _preset(tiny_model_dir, data, micro_batch_size=4, gradient_accumulation_steps=2, gpus=4)
    (on_four,) = write_format("trl", four, tmp_path / "four.yaml")
    assert _launch_args(on_four) == ["--num_processes", "4"]
    # ... which the launcher `trl sft` runs under reads (a TRL that launched otherwise would
    # not have this module).
    from accelerate.commands.launch import launch_command_parser
    from trl.cli.accelerate_launcher import launch_training_script  # noqa: F401

    assert launch_command_parser().parse_args([*_launch_args(on_four), "sft.py"]).num_processes == 4
    assert _sft_args(on_four)[1].gradient_accumulation_steps == 2  # each process's, as trained
    assert _sft_args(on_four)[1].ddp_find_unused_parameters is False  # as trainers.train
    assert sft.ddp_find_unused_parameters is None  # one process: no DDP
    assert "4 GPUs, data-parallel" in on_four.read_text()


def test_records_the_preset_skips_are_left_out_of_trls_copy(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A preset with `skip_bad_lines` over a JSONL file that has bad lines: TRL gets the good
    records, converted beside the config, not the file its loader would stop in."""
    from trl import get_dataset

    good = [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(40)]
    lines = [json.dumps(r) for r in good]
    lines[3:3] = ["{not json", json.dumps({"prompt": "no completion"})]
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(lines) + "\n")
    spec = TrainSpec(model=str(tiny_model_dir), data=str(data), skip_bad_lines=True)
    preset = preset_dict(spec, estimate=ESTIMATE, provenance=PROVENANCE)
    config, converted = write_format("trl", preset, tmp_path / "trl.yaml")
    assert [json.loads(line) for line in converted.read_text().splitlines()] == good
    _, _, _, mixture = _sft_args(config)
    split = get_dataset(mixture)
    assert len(split["train"]) + len(split["test"]) == len(good)


def test_data_read_through_its_columns_goes_to_trl_renamed(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A preset with `data_columns`: TRL renames no column, so it gets the records as hpo
    read them, converted beside the config; TRL's own loader reads them."""
    from trl import get_dataset

    rows = [{"question": f"q{i}", "answer": f" a{i}"} for i in range(30)]
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = TrainSpec(model=str(tiny_model_dir), data=str(data), data_columns="prompt=question,completion=answer")
    preset = preset_dict(spec, estimate=ESTIMATE, provenance=PROVENANCE)
    assert preset["data"]["data_columns"] == "prompt=question,completion=answer"
    config, converted = write_format("trl", preset, tmp_path / "trl.yaml")
    assert [json.loads(line) for line in converted.read_text().splitlines()] == [
        {"prompt": r["question"], "completion": r["answer"]} for r in rows
    ]
    _, _, _, mixture = _sft_args(config)
    split = get_dataset(mixture)
    assert set(split["train"].column_names) == {"prompt", "completion"}


def test_trl_evaluates_the_samples_hpo_evaluates_of_the_datas_own_split(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A preset that validates on its data folder's validation split: TRL's dataset mixture
    can only cut a test split at random out of the train records, so the export writes the
    train split and the first samples hpo evaluates of the validation split (`eval_samples`)
    as a folder of two splits, and `trl sft` trains on the one and evaluates the other."""
    from trl.scripts.sft import main

    folder = tmp_path / "hub"
    folder.mkdir()
    for split, count in (("train", 40), ("validation", 12), ("test", 5)):
        rows = (
            {"instruction": f"Say {split} {i}.", "input": "", "output": f"{split}-{i}"}
            for i in range(count)
        )
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    preset = _preset(
        tiny_model_dir, folder, validation_split="validation", eval_samples=5,
        micro_batch_size=4, max_length=48,
    )  # fmt: skip
    config, train, held = write_format("trl", preset, tmp_path / "trl.yaml")
    assert (train.parent, train.name, held.name) == (
        tmp_path / "trl.data", "train.jsonl", "validation.jsonl"
    )
    trained, evaluated = train.read_text().splitlines(), held.read_text().splitlines()
    assert len(trained) == 40 and all(f'"train-{i}"' in line for i, line in enumerate(trained))
    # hpo's run evaluates the split's first eval_samples: those, in order, and no other.
    marked = [[i for i in range(12) if f'"validation-{i}"' in line] for line in evaluated]
    assert marked == [[0], [1], [2], [3], [4]]
    assert "test-" not in train.read_text() + held.read_text()
    script, sft, _, mixture = _sft_args(config)
    assert mixture.datasets == [] and script.dataset_name == str(train.parent)
    loaded = datasets.load_dataset(script.dataset_name)  # as `trl sft` loads a dataset_name
    assert len(loaded[script.dataset_train_split]) == 40
    assert len(loaded[script.dataset_test_split]) == 5
    assert "of the samples hpo evaluates (the first of the data's validation split)" in (
        config.read_text()
    )
    main(*_sft_args(config, "--max_steps", "2", "--eval_steps", "2", "--save_steps", "2"))
    state = json.loads((tmp_path / "trl-output" / "checkpoint-2" / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"] if "eval_loss" in entry] == [2]


@pytest.mark.parametrize(
    ("records", "fraction", "eval_samples", "held_out"),
    [(6000, 0.1, 64, 64), (1001, 0.05, 48, 48), (300, 0.1, 64, 30), (20, 0.5, 4, 4)],
)
def test_trl_holds_out_what_hpo_evaluates(
    tmp_path: Path, tiny_model_dir: Path, records: int, fraction: float, eval_samples: int,
    held_out: int,
) -> None:  # fmt: skip
    """TRL evaluates its whole test split each time: the split holds the samples hpo's run
    evaluates (`eval_samples`, at most its validation share), not the preset's
    `validation_fraction` of the data, which made each evaluation of a large set score
    thousands of samples the estimate did not time. Counted by TRL's own loader."""
    from trl import get_dataset

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(
        json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}) + "\n" for i in range(records)
    ))  # fmt: skip
    preset = _preset(
        tiny_model_dir, data, validation_fraction=fraction, eval_samples=eval_samples
    )
    (config,) = write_format("trl", preset, tmp_path / "trl.yaml")
    _, sft, _, mixture = _sft_args(config)
    split = get_dataset(mixture)
    assert len(split["test"]) == held_out and len(split["train"]) == records - held_out
    # hpo evaluates min(eval_samples, its validation split); TRL the same count.
    validation = min(max(1, round(records * fraction)), records - 1)
    assert held_out == min(eval_samples, validation)
    assert sft.max_steps == ESTIMATE["full_run_steps"]  # the steps the estimate timed


@pytest.mark.parametrize(
    ("packing", "overflow", "expected"),
    [
        ("none", "truncate", {"packing": False}),
        ("padding_free", "truncate", {"packing": True, "packing_strategy": "bfd", "padding_free": True}),
        ("none", "pack", {"packing": True, "packing_strategy": "wrapped"}),
        ("group_by_length", "truncate", {"packing": False, "train_sampling_strategy": "group_by_length"}),
    ],
)
def test_packing(packing: str, overflow: str, expected: dict[str, object]) -> None:
    from hpo.export_formats import _packing

    assert _packing(packing, overflow) == expected


def test_a_grouped_preset_is_grouped_in_trl(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = demo_data_path("prompt_completion")
    preset = _preset(tiny_model_dir, data, micro_batch_size=4, packing="group_by_length")
    (written,) = write_format("trl", preset, tmp_path / "trl.yaml")
    _, sft, _, _ = _sft_args(written)
    assert not sft.packing and sft.train_sampling_strategy == "group_by_length"


@pytest.mark.parametrize(
    ("precision", "measured", "flags"),
    [
        ("auto", "bf16", (True, False)),
        ("auto", "fp16", (False, True)),
        ("fp32", "bf16", (False, False)),
        ("bf16", "fp32", (True, False)),
    ],
)
def test_precision(precision: str, measured: str, flags: tuple[bool, bool], tmp_path: Path) -> None:
    from hpo.export_formats import _precision, _resolved

    got = _precision(_resolved(precision, {"hardware": {"precision": measured}}))
    assert (got["bf16"], got["fp16"]) == flags


@pytest.mark.parametrize(
    ("interval", "steps_known", "expected"),
    [
        (25, True, ("steps", 25, 25)),
        (0, True, ("steps", 1200, None)),  # hpo's "only at the end": the last step
        (0, False, ("epoch", None, None)),
    ],
)
def test_evaluation_cadence_trl_accepts(
    tmp_path: Path, tiny_model_dir: Path, interval: int, steps_known: bool, expected: tuple
) -> None:
    """eval_interval 0 (only at the end) was written as `eval_steps: 0`, which TRL's
    parser refuses: every cadence hpo allows is one TRL reads."""
    preset = _preset(tiny_model_dir, demo_data_path("text"), eval_interval=interval)
    if not steps_known:
        preset["estimate"] = {k: v for k, v in ESTIMATE.items() if k != "full_run_steps"}
    (written,) = write_format("trl", preset, tmp_path / "trl.yaml")
    _, sft, _, _ = _sft_args(written)
    strategy, steps, logging = expected
    assert sft.eval_strategy.value == strategy
    if steps is not None:
        assert sft.eval_steps == steps
        assert interval or steps == sft.max_steps  # at the end: the run's last step
    if logging is not None:
        assert sft.logging_steps == logging


@pytest.mark.parametrize(
    ("liger", "compile_", "device", "expected"),
    [
        ("on", False, "cuda", (True, False)),
        ("on", True, "cpu", (False, True)),  # Liger's kernels are CUDA's
        ("off", True, "cuda", (False, True)),
        ("auto", False, "cuda", (False, False)),  # on once a lease measured it faster
    ],
)
def test_the_speed_levers_the_run_uses_go_to_trl(
    tmp_path: Path, tiny_model_dir: Path, liger: str, compile_: bool, device: str,
    expected: tuple[bool, bool],
) -> None:  # fmt: skip
    """Liger's kernels and torch.compile, where the preset's run uses them: left out, TRL's
    run would be slower than the estimate counted."""
    spec = TrainSpec(
        model=str(tiny_model_dir), data=str(demo_data_path("text")), liger=liger, compile=compile_
    )
    estimate = {**ESTIMATE, "hardware": {"device_kind": device, "precision": "fp32"}}
    preset = preset_dict(spec, estimate=estimate, provenance=PROVENANCE)
    (written,) = write_format("trl", preset, tmp_path / "trl.yaml")
    _, sft, _, _ = _sft_args(written)
    from trainers.model.levers import MEASURED_FASTER

    measured = liger == "auto" and device == "cuda" and "liger" in MEASURED_FASTER
    assert (sft.use_liger_kernel, sft.torch_compile) == (expected[0] or measured, expected[1])


@pytest.mark.parametrize(
    ("quantization", "measured", "dtype"),
    [("none", "bf16", "auto"), ("nf4", "bf16", "bfloat16"), ("nf4", "fp32", "float32")],
)
def test_trl_loads_the_base_as_the_trainer_does(
    tmp_path: Path, tiny_model_dir: Path, quantization: str, measured: str, dtype: str
) -> None:
    """`trl sft` loads a base in float32 unless told: a 16-bit preset loads as its checkpoint
    is stored (transformers 5's default, what `trainers.train` does), and an NF4 preset
    (QLoRA) in 4 bits with `trainers.model.quantization.nf4_config`'s settings, read back
    through TRL's own parser and `get_quantization_config`."""
    from trl import get_quantization_config

    from trainers.model.quantization import nf4_config

    spec = TrainSpec(
        model=str(tiny_model_dir), data=str(demo_data_path("text")), quantization=quantization
    )
    estimate = {**ESTIMATE, "hardware": {"device_kind": "cuda", "precision": measured}}
    preset = preset_dict(spec, estimate=estimate, provenance=PROVENANCE)
    (written,) = write_format("trl", preset, tmp_path / "trl.yaml")
    # bf16 needs a GPU to parse: the loading is what is checked here.
    _, _, model, _ = _sft_args(written, "--bf16", "false")
    assert model.dtype == dtype
    got = get_quantization_config(model)
    if quantization == "none":
        assert got is None
        return
    ours = nf4_config(measured)
    assert got.load_in_4bit and got.bnb_4bit_quant_type == ours.bnb_4bit_quant_type == "nf4"
    assert got.bnb_4bit_use_double_quant == ours.bnb_4bit_use_double_quant is True
    assert str(got.bnb_4bit_compute_dtype) == str(ours.bnb_4bit_compute_dtype)


def test_trl_sft_trains_an_nf4_preset_in_four_bits(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A QLoRA preset's TRL config trains, through `trl sft`'s main, a base whose linear
    layers are bitsandbytes' 4-bit ones (on the CPU here: bitsandbytes' CPU path)."""
    import bitsandbytes as bnb
    from trl import SFTTrainer
    from trl.scripts.sft import main

    spec = TrainSpec(
        model=str(tiny_model_dir), data=str(demo_data_path("prompt_completion")),
        quantization="nf4", max_steps=3,
    )  # fmt: skip
    estimate = {**ESTIMATE, "hardware": {"device_kind": "cpu", "precision": "fp32"}}
    preset = preset_dict(spec, estimate=estimate, provenance=PROVENANCE)
    (config,) = write_format("trl", preset, tmp_path / "trl.yaml")
    trained: list[Any] = []
    train = SFTTrainer.train

    def keep_the_model(trainer: Any, *args: Any, **kwargs: Any) -> Any:
        trained.append(trainer.model)  # the model TRL built from the config, then trained
        return train(trainer, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "train", keep_the_model)
    main(*_sft_args(config, "--eval_strategy", "no", "--save_strategy", "no"))
    (model,) = trained
    four_bit = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert four_bit and all(m.weight.quant_type == "nf4" for m in four_bit)
    assert (tmp_path / "trl-output" / "adapter_model.safetensors").is_file()


def test_trl_sft_trains_the_exported_config_and_the_loss_falls(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alpaca rows in Parquet: converted beside the config, then trained by `trl sft`'s main,
    tracked in the study's MLflow store under its parent run."""
    import mlflow.tracking._tracking_service.utils as tracking_utils
    import mlflow.tracking.fluent as fluent
    from mlflow import MlflowClient
    from trl.scripts.sft import main

    # The config's `env` section sets these in this process, and MLflow's callback sets the
    # fluent API's URI and experiment: all put back after the test. A URI another test left
    # set in this process would win over the config's (`MLflowCallback` keeps a set one):
    # `trl sft` starts in a process of its own, without one.
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_TAGS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tracking_utils, "_tracking_uri", None)  # as in a fresh `trl sft`
    monkeypatch.setattr(fluent, "_active_experiment_id", fluent._active_experiment_id)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    parent = client.create_run(client.create_experiment("studies")).info.run_id

    # Eight short answers repeated: a random-init model learns them fast, so the loss must fall.
    rows = [
        {"instruction": f"Name the colour number {i}.", "input": "", "output": colour}
        for i, colour in enumerate(["red", "green", "blue", "black", "white", "grey", "pink", "gold"])
    ] * 8
    data = tmp_path / "alpaca.parquet"
    datasets.disable_progress_bars()
    datasets.Dataset.from_list(rows).to_parquet(str(data))
    steps = 16
    preset = _preset(
        tiny_model_dir, data, micro_batch_size=8, learning_rate=3e-3, max_length=64,
        max_steps=steps,
    )  # fmt: skip
    preset["provenance"] = {**PROVENANCE, "mlflow_parent_run_id": parent}
    tracking = {"tracking_uri": uri, "experiment_name": "studies"}
    config, converted = write_format("trl", preset, tmp_path / "trl.yaml", tracking=tracking)
    records = [json.loads(line) for line in converted.read_text().splitlines()]
    # One reply a record: conversational prompt/completion, the loss on the reply (as hpo).
    assert len(records) == len(rows) and records[0]["completion"][0]["content"] == "red"
    assert yaml.safe_load(config.read_text())["datasets"][0]["data_files"] == str(converted)

    main(*_sft_args(config, "--logging_steps", "1", "--save_steps", str(steps),
                    "--eval_strategy", "no"))  # fmt: skip
    output = tmp_path / "trl-output"
    state = json.loads((output / f"checkpoint-{steps}" / "trainer_state.json").read_text())
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert len(losses) == steps
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < first - 0.5, losses
    adapter = json.loads((output / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (8, 16)
    # One run, beside the study's: nested under its parent, named by study, trial and role,
    # its measured runtime next to the estimate it was exported with.
    (run,) = client.search_runs(
        [client.get_experiment_by_name("studies").experiment_id],
        filter_string="tags.`hpo.role` = 'full_training_trl'",
    )
    tags = run.data.tags
    assert tags["mlflow.parentRunId"] == parent and run.info.run_name == "demo-study-trial-7-trl"
    assert (tags["hpo.study_name"], tags["hpo.trial_number"]) == ("demo-study", "7")
    assert tags["hpo.predicted_duration"] == "1.0 h (p10-p90 30.0 min to 1.5 h)"
    assert run.data.metrics["train_runtime"] > 0 and "train_loss" in run.data.metrics

    # The study reads it back: its train_runtime against the estimate of that part, the
    # whole run's band without the model's load and tokenization (0.1 of 1 h here).
    import optuna

    from analysis.calibration.full_runs import trl_runs
    from analysis.report.document import trl_line
    from hpo.full_run_reports import record_trl, trl_run_results

    experiment = run.info.experiment_id
    # Given another --max_steps than exported: not the run the estimate was made for.
    main(*_sft_args(config, "--max_steps", "4", "--eval_strategy", "no", "--save_strategy", "no"))
    assert len(client.search_runs([experiment])) == 3  # the parent and both TRL runs
    (read,) = trl_run_results(client, experiment, "demo-study")
    assert read.run_id == run.info.run_id and read.trial == 7
    assert read.seconds == run.data.metrics["train_runtime"]
    assert read.predicted == pytest.approx({"p10": 1620.0, "p50": 3240.0, "p90": 4860.0})
    assert trl_run_results(client, experiment, "another-study") == []
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="demo-study", storage=storage)
    assert record_trl(study, [read]) == 1 and record_trl(study, [read]) == 0  # kept once
    attrs = optuna.load_study(study_name="demo-study", storage=storage).user_attrs
    assert trl_runs(attrs) == [read]
    line = trl_line(attrs)
    assert line is not None and "trial 7: " in line and "54.0 min predicted" in line
    assert "below p10" in line  # a tiny run against an hour's estimate


def test_a_study_tracked_behind_a_password_or_not_at_all(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The password a study's URI needs is not written out (the store keeps it hidden): the
    user's own MLFLOW_TRACKING_URI is used. A study not tracked reports nowhere."""
    preset = _preset(tiny_model_dir, demo_data_path("prompt_completion"))
    hidden = {"tracking_uri": "http://me:***@mlflow.example:5000", "experiment_name": "e"}
    (written,) = write_format("trl", preset, tmp_path / "pw.yaml", tracking=hidden)
    config = yaml.safe_load(written.read_text())
    assert config["report_to"] == ["mlflow"] and config["env"]["MLFLOW_EXPERIMENT_NAME"] == "e"
    assert "MLFLOW_TRACKING_URI" not in config["env"] and "***" not in written.read_text()
    assert "the MLFLOW_TRACKING_URI you set" in written.read_text()
    _, sft, _, _ = _sft_args(written)  # TRL reads it, `env` and all
    assert sft.report_to == ["mlflow"]
    for tracking in (None, {"tracking_uri": "off", "experiment_name": "e"}):
        (off,) = write_format("trl", preset, tmp_path / "off.yaml", tracking=tracking)
        config = yaml.safe_load(off.read_text())
        assert config["report_to"] == "none" and "env" not in config
