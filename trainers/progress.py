"""A live progress bar for a training run (tqdm)."""

from __future__ import annotations

from typing import Any

from trainers.callbacks import EvalInfo, RunInfo, StepInfo, TrainingCallback
from trainers.result import TrainResult


class TqdmProgress(TrainingCallback):
    """Steps done / total with loss, tokens/s and tqdm's own ETA."""

    def __init__(self, description: str = "train", **tqdm_kwargs: Any) -> None:
        self.description = description
        self.tqdm_kwargs = tqdm_kwargs
        self.bar: Any = None
        self.last_eval: float | None = None

    def on_train_begin(self, info: RunInfo) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=info.total_steps, desc=self.description, unit="step", **self.tqdm_kwargs
        )

    def on_step(self, info: StepInfo) -> None:
        if self.bar is None:
            return
        postfix = {"loss": f"{info.loss:.3f}", "tok/s": f"{info.tokens_per_second:,.0f}"}
        if self.last_eval is not None:
            postfix["val"] = f"{self.last_eval:.3f}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def on_eval(self, info: EvalInfo) -> None:
        self.last_eval = info.loss
        if self.bar is not None:
            self.bar.write(f"step {info.step}: validation loss {info.loss:.4f}")

    def on_train_end(self, result: TrainResult) -> None:
        if self.bar is not None:
            self.bar.close()
