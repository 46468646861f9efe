"""The device/precision choice, covered for CUDA paths on a CPU-only machine."""

from __future__ import annotations

import pytest

from common.errors import BadInputError
from trainers.model.runtime import choose_runtime


def _choose(**overrides: object):
    kwargs: dict[str, object] = {
        "requested_device": "auto",
        "requested_precision": "auto",
        "compile": False,
        "cuda_available": False,
        "bf16_supported": False,
        "mps_available": False,
        "device_name": "x",
    }
    kwargs.update(overrides)
    return choose_runtime(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "device", "precision", "scaler", "fused", "pin", "tf32"),
    [
        ({}, "cpu", "fp32", False, False, False, False),
        ({"cuda_available": True, "bf16_supported": True}, "cuda", "bf16", False, True, True, True),
        ({"cuda_available": True, "bf16_supported": False}, "cuda", "fp16", True, True, True, True),
        (
            {"cuda_available": True, "bf16_supported": True, "requested_precision": "fp16"},
            "cuda",
            "fp16",
            True,
            True,
            True,
            True,
        ),
        (
            {"cuda_available": True, "requested_device": "cpu"},
            "cpu",
            "fp32",
            False,
            False,
            False,
            False,
        ),
        ({"mps_available": True}, "mps", "fp32", False, False, False, False),
    ],
)
def test_choice_table(overrides, device, precision, scaler, fused, pin, tf32) -> None:
    choice = _choose(**overrides)
    assert (choice.device, choice.precision) == (device, precision)
    args = choice.training_arguments()
    assert args["fp16"] is scaler  # the Trainer adds a grad scaler exactly for fp16
    assert choice.fused_adamw is fused
    assert choice.pin_memory is pin
    assert choice.tf32 is tf32
    assert args["bf16"] is (precision == "bf16")
    assert args["fp16"] is (precision == "fp16")
    assert args["optim"] == ("adamw_torch_fused" if fused else "adamw_torch")
    assert args["use_cpu"] is (device == "cpu")
    assert choice.reason  # the choice is explained in the log


def test_compile_only_on_cuda() -> None:
    assert _choose(compile=True, cuda_available=True, bf16_supported=True).compile is True
    cpu = _choose(compile=True)
    assert cpu.compile is False and "ignored" in cpu.reason


@pytest.mark.parametrize(
    "overrides",
    [
        {"requested_device": "cuda"},
        {"requested_device": "mps"},
        {"requested_precision": "bf16"},
        {"cuda_available": True, "bf16_supported": False, "requested_precision": "bf16"},
    ],
)
def test_impossible_requests_are_bad_input(overrides) -> None:
    with pytest.raises(BadInputError):
        _choose(**overrides)


def test_a_single_process_trains_on_one_gpu_however_many_it_sees(tmp_path) -> None:
    """transformers gives a process that sees 8 GPUs n_gpu 8: its Trainer would wrap the model
    in DataParallel and take 8 micro-batches a step. The trainer's arguments keep one."""
    from transformers import TrainingArguments

    from trainers.loop.trainer_setup import one_gpu_per_process, training_arguments
    from trainers.spec import TrainSpec

    spec = TrainSpec(model="m", data="d", output_dir=str(tmp_path), micro_batch_size=4)
    args = training_arguments(spec, _choose())
    assert args.n_gpu <= 1 and args.train_batch_size == 4  # this CPU: as it was
    seen = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, use_cpu=True)
    _ = seen.device
    seen._n_gpu = 8  # what _setup_devices sets on a node of 8 visible GPUs
    assert seen.train_batch_size == 32  # the DataParallel batch the Trainer would load
    kept = one_gpu_per_process(seen)
    assert kept.n_gpu == 1 and kept.train_batch_size == 4
    _ = kept.device  # a cached property: asked again, it does not set n_gpu back
    assert kept.n_gpu == 1
