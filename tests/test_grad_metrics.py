"""What the loop measures and logs per step: gradient norms before clipping; data loading."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.configs import demo_spec
from trainers.events import StepInfo, TrainingCallback
from trainers.loop.data_loading import choose_data_loading
from trainers.loop.run import train
from trainers.spec import LoraSpec


class Steps(TrainingCallback):
    def __init__(self) -> None:
        self.steps: list[StepInfo] = []

    def on_step(self, info: StepInfo) -> None:
        self.steps.append(info)


def _run(model: Path, tmp: Path, max_grad_norm: float) -> list[StepInfo]:
    steps = Steps()
    result = train(
        demo_spec(
            model,
            tmp,
            output_dir=str(tmp / f"out-{max_grad_norm}"),
            lora=LoraSpec(r=8, alpha=16),
            micro_batch_size=8,
            learning_rate=1e-2,
            max_steps=4,
            eval_interval=0,
            eval_samples=8,
            max_grad_norm=max_grad_norm,
        ),
        [steps],
    )
    assert [n for _, n in result.grad_norms] == [s.grad_norm for s in steps.steps]
    assert result.max_grad_norm == max_grad_norm
    return steps.steps


def test_gradient_norms_are_finite_and_measured_before_clipping(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    unclipped = _run(tiny_model_dir, tmp_path, 0.0)
    clipped = _run(tiny_model_dir, tmp_path, 1e-3)
    norms = [s.grad_norm for s in unclipped]
    assert len(norms) == 4 and all(n is not None and math.isfinite(n) and n > 0 for n in norms)
    # Step 1 starts from the same weights: the norm before clipping is the same, far above
    # the threshold; afterwards the clipped updates were smaller, so the runs part.
    assert clipped[0].grad_norm == pytest.approx(unclipped[0].grad_norm, rel=1e-5)
    assert (clipped[0].grad_norm or 0.0) > 100 * 1e-3
    assert clipped[-1].loss != pytest.approx(unclipped[-1].loss, rel=1e-6)


@pytest.mark.parametrize(
    ("device", "cores", "requested", "workers", "pin"),
    [
        ("cpu", 2, None, 0, False),  # measured: workers compete with training for the cores
        ("cpu", 64, None, 0, False),
        ("mps", 10, None, 0, False),
        ("cuda", 2, None, 0, True),
        ("cuda", 8, None, 3, True),
        ("cuda", 64, None, 4, True),
        ("cuda", 64, 1, 1, True),  # the user's choice wins
        ("cpu", None, None, 0, False),
    ],
)
def test_data_loading_follows_the_device_and_the_cores(
    device: str, cores: int | None, requested: int | None, workers: int, pin: bool
) -> None:
    choice = choose_data_loading(device, cores, requested)
    assert (choice.num_workers, choice.pin_memory) == (workers, pin)
    assert choice.persistent_workers == (workers > 0)
    args = choice.training_arguments()
    assert args["dataloader_num_workers"] == workers
    assert args["dataloader_persistent_workers"] == (workers > 0)
    assert device in choice.reason
