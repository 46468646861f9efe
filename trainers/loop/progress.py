"""A live progress bar for a training run (tqdm)."""

from __future__ import annotations

import time
from typing import Any

from common.fmt import format_duration
from trainers.events import EvalInfo, Forecast, RunInfo, StepInfo, TrainingCallback
from trainers.result import TrainResult


class TqdmProgress(TrainingCallback):
    """Steps done / total with loss, tokens/s and an ETA.

    tqdm's own ETA extrapolates the step rate; when the run has a window guard, the postfix
    adds the guard's ETA (which counts the evaluations and saves still to come) and whether
    the run is on track for its window.
    """

    def __init__(self, description: str = "train", **tqdm_kwargs: Any) -> None:
        self.description = description
        self.tqdm_kwargs = tqdm_kwargs
        self.bar: Any = None
        self.last_eval: float | None = None
        self.forecast: Forecast | None = None

    def on_train_begin(self, info: RunInfo) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=info.total_steps,
            initial=info.start_step,
            desc=self.description,
            unit="step",
            **self.tqdm_kwargs,
        )

    def on_step(self, info: StepInfo) -> None:
        if self.bar is None:
            return
        postfix = {"loss": f"{info.loss:.3f}", "tok/s": f"{info.tokens_per_second:,.0f}"}
        if self.last_eval is not None:
            postfix["val"] = f"{self.last_eval:.3f}"
        if self.forecast is not None:
            postfix["eta"] = time.strftime("%H:%M", time.localtime(self.forecast.eta_unix))
            if self.forecast.window_seconds is not None:
                postfix["window"] = (
                    "on track"
                    if self.forecast.on_track
                    else f"behind {format_duration(self.forecast.behind_seconds)}"
                )
        self.bar.set_postfix(postfix, refresh=False)
        # After a rollback the step goes back; the bar follows it.
        self.bar.update(info.step - self.bar.n)

    def on_eval(self, info: EvalInfo) -> None:
        self.last_eval = info.loss
        if self.bar is not None:
            self.bar.write(f"step {info.step}: validation loss {info.loss:.4f}")

    def on_forecast(self, forecast: Forecast) -> None:
        self.forecast = forecast

    def on_train_end(self, result: TrainResult) -> None:
        if self.bar is not None:
            self.bar.close()
