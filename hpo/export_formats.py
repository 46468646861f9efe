"""A preset written for another trainer: `python -m hpo.export --format trl`.

The TRL file is a config for TRL's own entry point, `trl sft --config FILE` (TRL's
`TrlParser`: the fields of `ScriptArguments`, `SFTConfig`, `ModelConfig` and
`DatasetMixtureConfig`). Its header comments say which study, trial and estimate it comes
from and what of the preset TRL does not do. Data in a shape TRL reads (text,
prompt/completion, messages) from a JSON(L) or Parquet file is referenced where it lies;
anything else (Alpaca, ShareGPT, CSV, a folder of files or a `save_to_disk` folder) is written
beside the config as `<config stem>.data.jsonl` in the equivalent native shape.

A study tracked in MLflow gets its TRL run tracked beside it: the config sets `report_to:
[mlflow]` and, in TRL's `env` section, the study's tracking URI and experiment and the tags
that nest the run under the study's parent run and name the study, trial, role
(`full_training_trl`) and the preset's duration estimate (transformers' `MLflowCallback` reads
them). Its `train_runtime` then sits beside the estimate in the UI, and the study's next session
reads it back against the estimate (`hpo.full_run_reports.trl_run_results`). Its loss does
not report back: TRL evaluates another held-out split.

Chat records carry loss on the tokens hpo's trainer trains (`hpo.export_chat`): a template
written beside the config where the tokenizer has none, prompt/completion records where each
has one reply, TRL's `assistant_only_loss` where the template marks the turns.

TRL evaluates its whole test split at every evaluation: the split holds out as many samples as
hpo's run evaluates (`_test_split`), and `max_steps` is the estimate's steps. Where the preset
validates on a split of its data (`validation_split`), TRL evaluates those samples themselves:
the train split and the validation split's first `eval_rows` go to `<config stem>.data/` as
`train.jsonl` and `validation.jsonl`, which the config names as `dataset_name` and its two
splits (TRL's dataset mixture cuts its test split at random).

axolotl and LLaMA-Factory formats are not shipped: neither package installs on these
machines in reasonable time without replacing the CPU torch (docs/how-to/export.md), so a written
file could not be checked with their own config loaders.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import yaml

from common.errors import BadInputError
from common.files import write_atomic
from common.fmt import format_duration
from common.redact import redact
from hpo.export_chat import (
    ChatLoss,
    chat_loss,
    prompt_completion_loss,
    template_kwargs_everywhere,
    uneven_template_kwargs,
)

if TYPE_CHECKING:
    from trainers.data.sources import DataSource

FORMATS = ("preset", "trl")
# `datasets` builders TRL's loader can point at a user's file directly.
_TRL_READABLE = {"jsonl": "json", "json": "json", "parquet": "parquet"}
_NATIVE = ("text", "prompt_completion", "messages")
# The `hpo.role` tag of a TRL run of a preset: not `full_training`, whose loss the study reads.
TRL_ROLE = "full_training_trl"
# On a TRL run: the estimate of its `train_runtime` ({"p10", "p50", "p90"} seconds) and the
# arguments it was made for, as JSON.
TRAIN_SECONDS_TAG, EXPORTED_ARGS_TAG = "hpo.predicted_train_seconds", "hpo.exported_args"
# What sets the steps and their duration: a run given others is not the run predicted.
COMPARED_ARGS = (
    "max_steps", "num_train_epochs", "per_device_train_batch_size",
    "gradient_accumulation_steps", "max_length", "eval_steps", "gradient_checkpointing",
    "packing", "use_liger_kernel", "torch_compile",
)  # fmt: skip


def write_format(
    fmt: str,
    preset: dict[str, Any],
    out: str | Path,
    tracking: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write `preset` (as `trainers.preset.preset_dict` makes it) for the trainer `fmt`.

    Args:
        tracking: The study's `tracking_uri` and `experiment_name` (as its config stores them,
            a password hidden); None or a URI of "off": the run is not tracked.

    Returns:
        The files written: the config first, then converted data if any.

    Raises:
        BadInputError: An unknown format, or data that cannot be read.
    """
    if fmt != "trl":
        raise BadInputError(f"--format must be one of {', '.join(FORMATS)}, but got {fmt!r}")
    path = Path(out)
    trl = trl_config(preset, data_out=_data_file(path), tracking=tracking)
    written = []
    if trl.held_rows is not None and trl.rows is not None:
        folder = split_folder(_data_file(path))
        folder.mkdir(parents=True, exist_ok=True)
        written.append(write_atomic(folder / "train.jsonl", _jsonl(trl.rows)))
        written.append(write_atomic(folder / "validation.jsonl", _jsonl(trl.held_rows)))
    elif trl.rows is not None:
        written.append(write_atomic(_data_file(path), _jsonl(trl.rows)))
    if trl.chat.template is not None:  # where the config's `chat_template_path` names it
        written.append(write_atomic(Path(trl.config["chat_template_path"]), trl.chat.template))
    text = _header(preset, trl.config, path, trl.chat.note) + yaml.safe_dump(
        trl.config, sort_keys=False
    )
    return [write_atomic(path, text), *written]


def _jsonl(rows: list[dict[str, Any]]) -> str:
    # Compact: tokenized records (`export_chat`'s fifth case) are mostly integers.
    return "".join(
        json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n" for row in rows
    )


def _data_file(config_path: Path) -> Path:
    return config_path.with_name(f"{config_path.stem}.data.jsonl")


class TrlFiles(NamedTuple):
    """What `trl_config` makes of a preset."""

    config: dict[str, Any]
    rows: list[dict[str, Any]] | None  # records converted for TRL, or None: the file as it is
    chat: ChatLoss  # how chat records carry loss (its template, its header line)
    # Where the preset validates on a split of its data: the records TRL evaluates (the
    # split's first `eval_rows`, as hpo's run), written beside `rows` in one folder.
    held_rows: list[dict[str, Any]] | None = None


def trl_config(
    preset: dict[str, Any], *, data_out: Path, tracking: Mapping[str, Any] | None = None
) -> TrlFiles:
    """The `trl sft` config of a preset, the converted records when TRL cannot read the data
    (or would take the loss elsewhere than hpo) and a chat template when TRL needs one.

    Args:
        preset: The preset content.
        data_out: Where converted records will be written (referenced by the config).
        tracking: As `write_format`'s.
    """
    from trainers.data.records import read_native
    from trainers.data.sources import open_source, with_columns

    lora, data, training = preset["lora"], preset["data"], preset["training"]
    estimate = preset.get("estimate") or {}
    source = with_columns(open_source(data["path"]), data.get("data_columns"))
    shape, native, skipped = read_native(source, skip_bad_lines=bool(data.get("skip_bad_lines")))
    held = _held(source, data)
    if held is not None:  # what hpo's run evaluates of it, converted as the train records are
        held = held[: eval_rows(len(native), data, training, len(held))]
    records = native + (held or [])  # one decision below for both
    rows: list[dict[str, Any]] | None = None
    chat = ChatLoss()
    if "messages" in native[0]:
        # Beside the converted data: `<config stem>.chat_template.jinja` (TRL reads a template
        # from a file only by its `.jinja` or `.j2` suffix).
        template_file = data_out.resolve().with_name(
            data_out.name.replace(".data.jsonl", ".chat_template.jinja")
        )
        chat = chat_loss(records, str(preset["model"]["path"]), str(template_file))
    elif isinstance(native[0].get("prompt"), list):
        chat = prompt_completion_loss(records, str(preset["model"]["path"]))
    # A file with records the preset skips (`skip_bad_lines`) is not given to TRL as it is:
    # its loader would stop at the first malformed line, or train on a record hpo refused.
    if chat.rows is not None:
        rows = chat.rows
        dataset = {"path": "json", "data_files": str(data_out.resolve())}
    elif (
        shape in _NATIVE and source.kind in _TRL_READABLE and not skipped and held is None
        and not uneven_template_kwargs(native) and not source.columns  # TRL renames none
    ):  # fmt: skip
        dataset = {"path": _TRL_READABLE[source.kind], "data_files": str(source.path.resolve())}
    else:
        rows = template_kwargs_everywhere(records)
        dataset = {"path": "json", "data_files": str(data_out.resolve())}
    held_rows = None
    if held is not None and rows is not None:
        trained = len(native) - sum(number < len(native) for number in chat.left_out)
        rows, held_rows = rows[:trained], rows[trained:]
    targets = lora["target_modules"]
    config: dict[str, Any] = {
        "model_name_or_path": preset["model"]["path"],
        **_datasets(dataset, held_rows, data_out, _test_split(len(native), data, training)),
        "use_peft": True,
        "lora_r": int(lora["r"]),
        "lora_alpha": float(lora["alpha"]),
        "lora_dropout": float(lora["dropout"]),
        # PEFT's "all-linear" finds every linear projection but the output layer, as 'auto' does.
        "lora_target_modules": ["all-linear"] if targets == "auto" else list(targets),
        "use_rslora": bool(lora.get("use_rslora", False)),
        "per_device_train_batch_size": int(training["micro_batch_size"]),
        "per_device_eval_batch_size": int(training["micro_batch_size"]) * 2,
        "gradient_accumulation_steps": int(training["gradient_accumulation_steps"]),
        "learning_rate": float(training["learning_rate"]),
        "lr_scheduler_type": training["scheduler"],
        "warmup_steps": float(training.get("warmup_ratio") or 0.0),  # < 1: a ratio of the steps
        "weight_decay": float(training.get("weight_decay") or 0.0),
        "max_grad_norm": float(training.get("max_grad_norm") or 0.0),
        "max_length": int(data["max_length"]),
        # The old name: transformers 5.17 (the GPU image's) knows no `activation_checkpointing`
        # and `trl sft` refuses the file; later 5.x read it as their alias. Written either way:
        # TRL's own default is on.
        "gradient_checkpointing": bool(training.get("gradient_checkpointing")),
        "seed": int(training.get("seed") or 0),
        "report_to": "none",  # `_mlflow` for a study tracked in MLflow
        # Beside the config, like the converted data: `<config stem>-output`.
        "output_dir": str(
            data_out.resolve().with_name(f"{data_out.name.removesuffix('.data.jsonl')}-output")
        ),
    }
    config.update(_packing(training.get("packing", "none"), data.get("overflow", "truncate")))
    # The steps the estimate timed. The epochs would make more: TRL trains on all but the
    # samples it evaluates, hpo on all but its validation share.
    steps = training.get("max_steps") or estimate.get("full_run_steps")
    if steps:
        config["max_steps"] = int(steps)
    else:
        config["num_train_epochs"] = float(training["epochs"])
    config.update(_evaluation(int(training["eval_interval"]), config.get("max_steps")))
    config.update(_save_cadence(training, estimate))
    precision = _resolved(training.get("precision", "auto"), estimate)
    config.update(_precision(precision))
    config.update(_weights(training.get("quantization", "none"), precision))
    config.update(_levers(training, estimate))
    config.update(chat.config)
    if config["gradient_checkpointing"]:
        # As trainers.train checkpoints: non-reentrant, which TRL 1.0's SFT leaves to
        # transformers' default, and not every transformers release defaults to it.
        config["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    config.update(_mlflow(preset, tracking, config))
    # Not an SFTConfig field: `trl sft` passes the keys its parser does not know to
    # `accelerate launch`, which otherwise starts one process per GPU it sees (an 8-GPU node:
    # 8 x the preset's effective batch). The preset's count, each process micro-batch x
    # accumulation, as `trainers.train --gpus N` trains it.
    config["num_processes"] = int(training.get("gpus") or 1)
    if config["num_processes"] > 1:
        # As trainers.train: every adapter weight takes part in every step, so DDP need not
        # search the graph for unused ones at each (transformers searches for a PEFT model).
        config["ddp_find_unused_parameters"] = False
    return TrlFiles(config, rows, chat, held_rows)


def _held(source: DataSource, data: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The good records of the data's own validation split (the preset's
    `validation_split`), or None."""
    split = data.get("validation_split")
    if not split:
        return None
    from trainers.data.records import read_native
    from trainers.data.sources import with_split

    held = with_split(source, str(split))
    return read_native(held, skip_bad_lines=bool(data.get("skip_bad_lines")))[1]


def split_folder(data_out: Path) -> Path:
    """The folder of a preset's converted train and validation records (`<stem>.data`):
    `train.jsonl` and `validation.jsonl`, which `datasets` reads as those two splits."""
    return data_out.with_name(data_out.name.removesuffix(".jsonl"))


def _datasets(
    dataset: dict[str, str],
    held_rows: list[dict[str, Any]] | None,
    data_out: Path,
    test_split: float,
) -> dict[str, Any]:
    """Where TRL reads its data: the file as its dataset mixture, of which it holds out the
    samples hpo evaluates at random; or, where the preset validates on a split of its data,
    a folder of two splits whose validation split holds those samples themselves (TRL's
    mixture has one split of its own, its test split cut at random: `dataset_name` reads a
    folder's splits as they are)."""
    if held_rows is None:
        return {"datasets": [{**dataset, "split": "train"}], "test_split_size": test_split}
    return {
        "dataset_name": str(split_folder(data_out.resolve())),
        "dataset_train_split": "train",
        "dataset_test_split": "validation",
    }


def eval_rows(
    records: int, data: Mapping[str, Any], training: Mapping[str, Any], held: int | None = None
) -> int:
    """The samples hpo's run evaluates each time: `eval_samples` of its validation split
    (`held` records: the data's own `validation_split`)."""
    from trainers.data.dataset import validation_count

    validation = (
        held if held is not None else validation_count(records, float(data["validation_fraction"]))
    )
    return max(1, min(int(training.get("eval_samples") or validation), validation))


def _test_split(records: int, data: Mapping[str, Any], training: Mapping[str, Any]) -> float:
    """TRL's `test_split_size` that holds out as many samples as hpo evaluates.

    TRL evaluates its whole test split at every evaluation. The preset's `validation_fraction`
    as that split (10 % by default) made each evaluation of a 600k-sample run score 60k
    samples where the estimate timed `eval_samples` (64): a run many times its estimate.
    `datasets`' `train_test_split` takes ceil(fraction x rows); half a row under the count
    keeps a float's rounding from adding one.
    """
    if records < 2:
        return float(data["validation_fraction"])  # TRL's own split refuses it, as hpo does
    return (eval_rows(records, data, training) - 0.5) / records


def _evaluation(interval: int, steps: int | None) -> dict[str, Any]:
    """hpo's evaluation cadence in TRL's terms. Interval 0 is hpo's "only at the end", which
    TRL's `eval_steps: 0` refuses: one evaluation at the last step (each epoch's end when the
    steps are not known); the loss is then logged at transformers' own default cadence."""
    if interval > 0:
        return {"eval_strategy": "steps", "eval_steps": interval, "logging_steps": interval}
    if steps:
        return {"eval_strategy": "steps", "eval_steps": int(steps)}
    return {"eval_strategy": "epoch"}


def _mlflow(
    preset: dict[str, Any], tracking: Mapping[str, Any] | None, config: Mapping[str, Any]
) -> dict[str, Any]:
    """`report_to: [mlflow]` and the environment transformers' `MLflowCallback` reads, for a
    study tracked in MLflow; nothing for one that is not (the run reports nowhere).

    The tags carry what the study compares the run's `train_runtime` with when it reads it
    back (`hpo.full_run_reports.trl_run_results`): the estimate of the part that covers
    (`TRAIN_SECONDS_TAG`) and the arguments it was made for (`EXPORTED_ARGS_TAG`: a run
    given another `--max_steps` on the command line is not the run predicted)."""
    provenance = preset.get("provenance") or {}
    uri = str((tracking or {}).get("tracking_uri") or "")
    experiment = (tracking or {}).get("experiment_name")
    if not uri or uri == "off" or not experiment:
        return {}
    tags = {
        "hpo.role": TRL_ROLE,
        "hpo.study_name": str(provenance.get("study")),
        "hpo.trial_number": str(provenance.get("trial")),
    }
    parent = provenance.get("mlflow_parent_run_id")
    if parent:  # the UI shows it under the study's run
        tags["mlflow.parentRunId"] = str(parent)
    predicted = _duration_band(preset.get("estimate") or {})
    if predicted:
        tags["hpo.predicted_duration"] = predicted
    train = train_seconds_band(preset.get("estimate") or {})
    if train:
        tags[TRAIN_SECONDS_TAG] = json.dumps(train)
        tags[EXPORTED_ARGS_TAG] = json.dumps({k: config[k] for k in COMPARED_ARGS if k in config})
    env = {"MLFLOW_EXPERIMENT_NAME": str(experiment), "MLFLOW_TAGS": json.dumps(tags)}
    if redact(uri) == uri and "***" not in uri:  # a URI with a password is not written out
        env = {"MLFLOW_TRACKING_URI": uri, **env}
    run_name = f"{provenance.get('study')}-trial-{provenance.get('trial')}-trl"
    return {"report_to": ["mlflow"], "run_name": run_name, "env": env}


def train_seconds_band(estimate: Mapping[str, Any]) -> dict[str, float]:
    """The estimate of what TRL's `train_runtime` measures: the run without the model's load
    and the data's tokenization (both before `Trainer.train`), as p10/p50/p90 seconds; {}
    without a breakdown.

    The band is the whole run's, scaled: the time model's p10 and p90 are the total times a
    factor each (`analysis.timemodel.model.predict`), and start-up and tokenization are a few
    per cent of a full run.
    """
    hours = estimate.get("duration_hours") or {}
    parts = estimate.get("breakdown_hours") or {}
    if not all(_is_number(hours.get(q)) for q in ("p10", "p50", "p90")) or not parts:
        return {}
    p50 = float(hours["p50"])
    before = sum(float(parts.get(k) or 0.0) for k in ("startup", "data_loading"))
    if p50 <= 0 or before >= p50:
        return {}
    share = (p50 - before) / p50
    return {q: round(float(hours[q]) * 3600 * share, 3) for q in ("p10", "p50", "p90")}


def _duration_band(estimate: dict[str, Any]) -> str:
    """The preset's duration estimate as one tag value: "1.1 h (p10-p90 54 min to 1.4 h)"."""
    hours = estimate.get("duration_hours") or {}
    if not all(_is_number(hours.get(q)) for q in ("p10", "p50", "p90")):
        return ""
    p10, p50, p90 = (format_duration(float(hours[q]) * 3600) for q in ("p10", "p50", "p90"))
    return f"{p50} (p10-p90 {p10} to {p90})"


def _packing(packing: str, overflow: str) -> dict[str, Any]:
    """hpo's packing as TRL's: samples kept apart in one row, or one stream cut into blocks."""
    if packing == "padding_free":
        # Whole samples side by side, attention kept apart by position ids (TRL's default).
        return {"packing": True, "packing_strategy": "bfd", "padding_free": True}
    if packing == "group_by_length":
        return {"packing": False, "train_sampling_strategy": "group_by_length"}
    if overflow == "pack":
        return {"packing": True, "packing_strategy": "wrapped"}  # concatenated, cut anywhere
    return {"packing": False}


def _save_cadence(training: dict[str, Any], estimate: dict[str, Any]) -> dict[str, Any]:
    """Checkpoints every N optimizer steps; a cadence in minutes becomes steps at the estimate."""
    keep = (
        {"save_total_limit": int(training["keep_checkpoints"])}
        if training.get("keep_checkpoints")
        else {}
    )
    if training.get("checkpoint_interval"):
        return {
            "save_strategy": "steps",
            "save_steps": int(training["checkpoint_interval"]),
            **keep,
        }
    minutes = training.get("checkpoint_minutes")
    hours = (estimate.get("duration_hours") or {}).get("p50")
    steps = estimate.get("full_run_steps")
    if minutes and hours and steps:
        step_seconds = float(hours) * 3600 / int(steps)
        every = max(1, math.floor(float(minutes) * 60 / step_seconds))
        return {"save_strategy": "steps", "save_steps": every, **keep}
    return {"save_strategy": "epoch", **keep}


def _resolved(requested: str, estimate: dict[str, Any]) -> str:
    """The run's precision: 'auto' becomes the one the study measured, when it says one."""
    measured = (estimate.get("hardware") or {}).get("precision")
    return str(measured) if requested == "auto" and measured else requested


def _weights(quantization: str, precision: str) -> dict[str, Any]:
    """How TRL loads the base, as `trainers.train` does.

    `trl sft` loads a model in float32 unless told (its `ModelConfig.dtype` default), where
    transformers 5 and this trainer load it as its checkpoint is stored: a 16-bit 7B base then
    holds 28 GB of frozen weights instead of 14, and computes on them cast each step. An NF4
    preset (QLoRA) otherwise trained a 16-bit (float32) base: TRL's `load_in_4bit` with NF4 and
    double quantization, as `trainers.model.quantization.nf4_config`, computing in the run's
    precision (TRL's `dtype` is both the compute type and that of the layers kept whole).
    """
    if quantization != "nf4":
        return {"dtype": "auto"}
    dtype = {"fp32": "float32", "fp16": "float16"}.get(precision, "bfloat16")  # TRL's default
    return {
        "dtype": dtype,
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "use_bnb_nested_quant": True,
    }


def _levers(training: Mapping[str, Any], estimate: Mapping[str, Any]) -> dict[str, bool]:
    """The speed levers the preset's run uses that TRL has: Liger's kernels (where
    `trainers.model.levers.requested_levers` turns them on for the estimate's device) and
    `torch.compile`. Left out, the TRL run is slower than the estimate counted."""
    from trainers.model.levers import requested_levers

    kind = str((estimate.get("hardware") or {}).get("device_kind") or "cuda")
    levers: dict[str, bool] = {}
    if "liger" in requested_levers(str(training.get("liger") or "auto"), "off", kind):
        levers["use_liger_kernel"] = True
    if training.get("compile"):
        levers["torch_compile"] = True
    return levers


def _precision(precision: str) -> dict[str, bool]:
    """bf16/fp16 flags of the resolved precision."""
    if precision == "bf16":
        return {"bf16": True, "fp16": False}
    if precision == "fp16":
        return {"bf16": False, "fp16": True}
    if precision == "fp32":
        return {"bf16": False, "fp16": False}
    return {}  # 'auto' without a measurement: TRL's own default (bf16 unless fp16 is set)


def _header(preset: dict[str, Any], config: dict[str, Any], path: Path, chat_note: str) -> str:
    provenance = preset.get("provenance") or {}
    estimate = preset.get("estimate") or {}
    duration = estimate.get("duration_hours") or {}
    band = ", ".join(f"{k} {float(v):.3g} h" for k, v in duration.items() if _is_number(v))
    training = preset["training"]
    lines = [
        f"hpo export for TRL: run it with  trl sft --config {path}",
        f"study {provenance.get('study')!s}, trial {provenance.get('trial')!s}, "
        f"value {provenance.get('value')!s}, MLflow run {provenance.get('mlflow_run_id')!s}",
        f"estimate (hpo.trainers.train on {_hardware(estimate)}): {band or 'none'}; "
        f"window {estimate.get('window_hours')!s} h",
        "The estimate carries to TRL for the same model, batch shape, precision and data; "
        "TRL differs in: no window guard, early stopping or divergence rollback; "
        + (
            "evaluation at max_length (hpo: eval_max_length), of the samples hpo evaluates "
            f"(the first of the data's {split} split)"
            if (split := (preset.get("data") or {}).get("validation_split"))
            else "a random held-out split of the samples it evaluates (hpo: the first "
            "eval_samples of a validation_fraction split, at eval_max_length)"
        ),
    ]
    if chat_note:
        lines.append(chat_note)
    if config.get("max_steps") and not training.get("max_steps"):
        lines.append(
            f"max_steps {config['max_steps']:,}: the preset's {training['epochs']:g} epoch(s) "
            "over hpo's training split, the steps the estimate timed (TRL trains on every "
            "sample but those it evaluates: its epochs would run longer)"
        )
    gpus = int(config.get("num_processes") or 1)
    if gpus > 1:
        lines.append(
            f"{gpus} GPUs, data-parallel: num_processes {gpus} goes to accelerate launch "
            f"(effective batch {gpus} x micro-batch x accumulation, as the preset's)"
        )
    else:
        lines.append(
            "one GPU: on a node of several, run it with CUDA_VISIBLE_DEVICES set to one "
            "(in a process that sees several, transformers' Trainer uses them all, "
            "DataParallel, with as many micro-batches a step: another batch than the preset's)"
        )
    env = config.get("env") or {}
    if env:
        where = "the study's tracking URI" if "MLFLOW_TRACKING_URI" in env else (
            "the MLFLOW_TRACKING_URI you set (the study's holds a password this file does "
            "not carry; set MLFLOW_TRACKING_USERNAME/PASSWORD too)"
        )  # fmt: skip
        lines.append(
            f"tracked in MLflow under the study's run, experiment {env['MLFLOW_EXPERIMENT_NAME']}, "
            f"at {where}; the study reads its train_runtime back against the estimate, not "
            "its loss (another split)"
        )
    if training.get("checkpoint_minutes") and config.get("save_strategy") == "steps":
        lines.append(
            f"checkpoint every {training['checkpoint_minutes']} min -> save_steps "
            f"{config['save_steps']} at the estimate's step time"
        )
    return "".join(f"# {line}\n" for line in lines)


def _hardware(estimate: dict[str, Any]) -> str:
    hardware = estimate.get("hardware") or {}
    return str(hardware.get("device_name") or hardware.get("device_kind") or "unknown hardware")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
