"""transformers' Trainer, measured and guarded.

A thin Trainer subclass times each micro-step (forward + backward), evaluation and checkpoint
save, and writes checkpoints through `trainers.loop.checkpoint` (staged, with a manifest, rotated).
A bridge callback turns Trainer events into the plain callbacks of `trainers.events`,
asks the window guard after every step, and honours stop requests.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.trainer_utils import EvalLoopOutput

from common.errors import Diverged
from trainers.data.packing import samples_in
from trainers.events import EvalInfo, RunInfo, StepInfo, TrainingCallback
from trainers.loop import checkpoint, distributed
from trainers.loop.early_stopping import EarlyStopping, mean_train_loss
from trainers.loop.recovery import DivergenceMonitor
from trainers.loop.window import WindowGuard
from trainers.result import TrainResult

log = logging.getLogger("trainers.loop.run")


class Clock:
    """Wall clock that waits for queued GPU work, so timings are real on CUDA."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


class Recorder:
    """Collects measurements while the Trainer runs (shared by every attempt of a run)."""

    def __init__(self, result: TrainResult, clock: Clock) -> None:
        self.result = result
        self.clock = clock
        self.step_loss = torch.zeros(())
        self.step_tokens = 0
        self.step_samples = 0
        self.step_grad_norm: float | None = None
        self.last_micro_end = 0.0
        self.mark = 0.0  # end of the last step, evaluation or save
        self.peak_rss = 0
        self.last_checkpoint: tuple[str, float] | None = None  # path, seconds

    def new_attempt(self) -> None:
        """Forget a half-accumulated optimizer step (the attempt before failed inside it)."""
        self.step_loss = torch.zeros(())
        self.step_tokens = 0
        self.step_samples = 0


@dataclass
class TrainerHooks:
    """What the run lends its Trainer, the same for every attempt.

    Attributes:
        recorder: Collects the measurements.
        bridge: Trainer events -> plain callbacks and the window guard.
        keep_checkpoints: Latest checkpoints kept when rotating.
        run_state: The `run_state.json` content of a checkpoint saved at a step.
        divergence: Watches validation losses (None: no divergence check).
        early_stopping: Stops the run when the validation loss stops improving (None: off).
        lr_ratio_on_load: Learning-rate correction when resuming from a checkpoint saved at
            another learning-rate scale (set before each attempt).
    """

    recorder: Recorder
    bridge: Bridge
    keep_checkpoints: int
    run_state: Callable[[int], dict[str, Any]]
    divergence: DivergenceMonitor | None = None
    early_stopping: EarlyStopping | None = None
    lr_ratio_on_load: float = 1.0


class MeasuredTrainer(Trainer):
    """Trainer that times its work and writes verified checkpoints."""

    def __init__(
        self,
        *args: Any,
        hooks: TrainerHooks,
        eval_collator: Callable[[Any], dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.eval_collator = eval_collator
        self.recorder = hooks.recorder
        self.bridge = hooks.bridge
        self.keep_checkpoints = hooks.keep_checkpoints
        self.run_state = hooks.run_state
        self.divergence = hooks.divergence
        self.early_stopping = hooks.early_stopping
        self.lr_ratio_on_load = hooks.lr_ratio_on_load
        self._flops_per_token: int | None = None
        if isinstance(self.model, torch.nn.Module):
            _skip_redundant_mode_switches(self.model)

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        # The Trainer's version walks every parameter on every micro-step (~9 % of a tiny
        # model's step time); the count does not change during a run.
        if self._flops_per_token is None:
            self._flops_per_token = super().floating_point_ops(
                {"input_ids": torch.zeros(1, 1, dtype=torch.long)}
            )
        return self._flops_per_token * int(inputs["input_ids"].numel())

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        dataset = self.train_dataset if train_dataset is None else train_dataset
        examples = getattr(dataset, "examples", None)
        if self.args.train_sampling_strategy != "group_by_length" or examples is None:
            return super()._get_train_sampler(train_dataset)
        # The Trainer reads lengths only from a `datasets.Dataset` column; ours are examples.
        # Its groups are one optimizer step of every process (the Trainer's own are one
        # process's share): one order, whether N processes or one with N times the
        # accumulation train it, so a study's trial and its full run take the same steps.
        return LengthGroupedSampler(
            self.args.train_batch_size
            * self.args.gradient_accumulation_steps
            * max(self.args.world_size, 1),
            lengths=[len(example.input_ids) for example in examples],
        )

    def _get_eval_sampler(self, eval_dataset: Any) -> Any:
        # `evaluation_loop` orders the validation samples itself (longest first), whatever
        # the training's sampling; the Trainer's grouped sampler could not read our examples.
        return torch.utils.data.SequentialSampler(eval_dataset)

    def training_step(
        self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor:
        rec = self.recorder
        start = rec.clock.now()
        ids = inputs["input_ids"]
        loss = super().training_step(model, inputs, num_items_in_batch)
        end = rec.clock.now()
        rec.result.micro_step_seconds.append(end - start)
        rec.result.micro_step_tokens.append(int(ids.numel()))
        rec.result.micro_step_seq_len.append(int(ids.shape[1]))
        rec.step_tokens += int(ids.numel())
        rec.step_samples += samples_in(inputs)
        # Trainer scales each micro-step loss so that their sum is the optimizer-step loss.
        rec.step_loss = rec.step_loss + loss.detach().float().cpu()
        rec.last_micro_end = end
        return loss

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> Any:
        # The norm before clipping (the Trainer's clip returns it), kept for the step's info.
        norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        value = float(norm.item() if hasattr(norm, "item") else norm) if norm is not None else None
        self.recorder.step_grad_norm = value
        return norm

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        rec = self.recorder
        start = rec.clock.now()
        metrics = super().evaluate(*args, **kwargs)
        end = rec.clock.now()
        seconds = end - start
        step = self.state.global_step
        loss = float(metrics["eval_loss"])
        # The tokens this process scored (all of them on one): what its seconds were spent on.
        n_tokens = sum(len(e.input_ids) for e in self._eval_share())
        previous = int(rec.result.eval_losses[-1][0]) if rec.result.eval_losses else 0
        train_loss = mean_train_loss(rec.result.train_losses, previous, step)
        rec.result.eval_losses.append([step, loss])
        rec.result.eval_records.append(
            {
                "step": step,
                "loss": loss,
                "seconds": seconds,
                "tokens": n_tokens,
                "samples_seen": rec.result.samples_seen,
                "tokens_seen": rec.result.tokens_seen,
                "train_loss": train_loss,
            }
        )
        rec.mark = end  # the next step interval starts after the evaluation
        info = EvalInfo(step=step, loss=loss, seconds=seconds, train_loss=train_loss)
        self.bridge.guard.on_eval(info)
        self.bridge.fan_out("on_eval", info, self.control)
        self._check_early_stopping(step, loss)
        if self.divergence is not None:
            reason = self.divergence.observe(step, loss)
            if reason is not None:
                raise Diverged(reason, safe_step=self.divergence.best_step)
        return metrics

    def evaluation_loop(
        self,
        dataloader: Any,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """The validation loss per token, whatever the batching; no gradients.

        The Trainer's loop averages the batches' mean losses, weighted by samples, so the
        same validation set scored at micro-batch 1 and 8 gives two numbers, and trials of
        a study that differ in micro-batch are not on one scale. This one sums the loss over
        every target token and divides by their count. Samples go longest first in batches
        of `per_device_eval_batch_size` (twice the training micro-batch: no activations are
        kept for a backward pass), so a batch pads to about its own length; the batch
        halves after an out-of-memory error and stays halved for the run. On N processes
        each scores every N-th sample of that order (about an N-th of the tokens) and the
        sums are added: the same loss, N times sooner.
        """
        examples = self._eval_share()
        own: Any = self.model
        model = self._wrap_model(own, training=False)
        model.eval()
        while True:
            try:
                total, count = self._loss_sum(model, examples, self.args.per_device_eval_batch_size)
                break
            except torch.OutOfMemoryError:
                if self.args.per_device_eval_batch_size <= 1:
                    raise
                self.args.per_device_eval_batch_size //= 2
                log.warning(
                    "evaluation ran out of memory: batch %d from now on",
                    self.args.per_device_eval_batch_size,
                )
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        summed, tokens = distributed.summed([total, count])  # over the processes' shares
        loss = summed / tokens if tokens else float("nan")
        return EvalLoopOutput(
            predictions=None,  # type: ignore[arg-type]
            label_ids=None,
            metrics={f"{metric_key_prefix}_loss": loss},
            num_samples=len(self.eval_dataset),  # type: ignore[arg-type]
        )

    def _eval_share(self) -> list[Any]:
        """This process's validation samples: every N-th of them, longest first."""
        ordered = sorted(self.eval_dataset, key=lambda e: -len(e.input_ids))  # type: ignore[arg-type]
        return ordered[self.args.process_index :: max(self.args.world_size, 1)]

    def _loss_sum(self, model: Any, examples: list[Any], batch: int) -> tuple[float, int]:
        """Summed loss over the target tokens of `examples`, and their count."""
        collate: Any = self.eval_collator or self.data_collator
        total, count = 0.0, 0
        with torch.no_grad():
            for first in range(0, len(examples), batch):
                inputs = self._prepare_inputs(collate(examples[first : first + batch]))
                # The model shifts the labels: each row predicts its tokens after the first.
                targets = int((inputs["labels"][:, 1:] != -100).sum())
                if targets == 0:
                    continue
                with self.compute_loss_context_manager():
                    loss = model(**inputs).loss
                total += float(loss.float()) * targets  # the model's loss: mean over targets
                count += targets
        return total, count

    def _check_early_stopping(self, step: int, loss: float) -> None:
        """Keep a checkpoint of each new best; stop when the loss stopped improving."""
        if self.early_stopping is None or self.recorder.result.stop_reason is not None:
            return
        verdict = self.early_stopping.observe(step, loss)
        if verdict.improved and self.bridge.checkpointing:
            self.control.should_save = True  # the best adapter must be on disk to be kept
        if verdict.stop and verdict.reason:
            log.warning("%s", verdict.reason)
            self.bridge.request_stop(self.control, verdict.reason, "stopped_early")

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Stage every file a resume needs, add the manifest, rename into place, rotate.

        With several processes, process 0 writes the checkpoint and each process adds its
        own random-number state (`rng_state_<rank>.pth`: their dropout masks differ).
        """
        rec = self.recorder
        start = rec.clock.now()
        step = int(self.state.global_step)
        out = str(self.args.output_dir)
        main = self.args.process_index == 0
        self.store_flos()  # sums the processes' counts: every process takes part
        staging = distributed.from_main(checkpoint.new_staging(out, step) if main else None)
        path = checkpoint.checkpoint_path(out, step)
        try:
            self._save_rng_state(str(staging))
            distributed.wait_for_all()  # every state file is in before the manifest
            if main:
                unwrapped = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
                unwrapped.save_pretrained(str(staging))  # adapter weights (safetensors) + config
                self._save_optimizer_and_scheduler(str(staging))
                self._save_scaler(str(staging))
                self.state.save_to_json(str(staging / TRAINER_STATE_NAME))
                path = checkpoint.commit(staging, out, step, self.run_state(step))
        except BaseException:
            import shutil

            if main:
                shutil.rmtree(staging, ignore_errors=True)
            raise
        if main:
            checkpoint.rotate(out, self.keep_checkpoints)
        distributed.wait_for_all()  # a stopped run's checkpoint is whole when any process ends
        end = rec.clock.now()
        rec.result.checkpoint_seconds.append(end - start)
        rec.result.checkpoint_dir = str(path.resolve())
        rec.last_checkpoint = (str(path), end - start)
        rec.mark = end

    def _load_optimizer_and_scheduler(self, checkpoint_dir: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint_dir)
        ratio = self.lr_ratio_on_load
        if checkpoint_dir is None or ratio == 1.0:
            return
        # The saved optimizer and scheduler carry the learning rate of their time; a rollback
        # continues at a lower one.
        optimizer: Any = self.optimizer
        for group in optimizer.param_groups:
            group["lr"] *= ratio
            if "initial_lr" in group:
                group["initial_lr"] *= ratio
        scheduler: Any = self.lr_scheduler
        scheduler.base_lrs = [lr * ratio for lr in scheduler.base_lrs]
        scheduler._last_lr = [lr * ratio for lr in scheduler.get_last_lr()]


class Bridge(TrainerCallback):
    """Trainer events -> plain callbacks, window checks, time-based saves, stop requests."""

    def __init__(
        self,
        recorder: Recorder,
        callbacks: Sequence[TrainingCallback],
        guard: WindowGuard,
        *,
        wall_start: float,
        run_info: Callable[[int, int], RunInfo],
        checkpointing: bool,
        checkpoint_minutes: float,
        report_forecasts: bool,
        stop_after_steps: int | None = None,
    ) -> None:
        self.rec = recorder
        self.callbacks = list(callbacks)
        self.guard = guard
        self.wall_start = wall_start
        self.run_info = run_info
        self.checkpointing = checkpointing
        self.checkpoint_minutes = checkpoint_minutes
        self.report_forecasts = report_forecasts
        self.stop_after_steps = stop_after_steps
        self.train_begin = 0.0
        self.last_save = 0.0
        self.started = False
        self.on_track = True  # the last reported verdict

    def fan_out(self, hook: str, payload: Any, control: Any) -> None:
        for callback in self.callbacks:
            if getattr(callback, hook)(payload):
                self.request_stop(control, callback.stop_reason(hook), callback.stop_status)

    def request_stop(self, control: Any, reason: str, status: str) -> None:
        control.should_training_stop = True
        if self.checkpointing or status in ("stopped_by_window", "stopped_by_signal"):
            control.should_save = True  # a stopped run can be resumed
        res = self.rec.result
        if res.stop_reason is None:
            res.stop_reason, res.status = reason, status

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Called once per attempt; the plain callbacks hear about the first one only."""
        res = self.rec.result
        res.total_steps = int(state.max_steps)
        now = self.rec.clock.now()
        self.rec.mark = self.last_save = now
        self.rec.new_attempt()
        if self.started:
            return
        self.started = True
        self.train_begin = now
        info = self.run_info(res.total_steps, int(state.global_step))
        self.guard.on_train_begin(info)
        self.fan_out("on_train_begin", info, control)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        rec, res = self.rec, self.rec.result
        step = int(state.global_step)
        # Each process saw its share of the step: the step's loss is the mean over all of
        # them (each process's loss is its token sum over the step's tokens on every
        # process, times their count; see Trainer.compute_loss), tokens and samples the sum.
        loss_sum, tokens, samples = distributed.summed(
            [float(rec.step_loss), rec.step_tokens, rec.step_samples]
        )
        loss = loss_sum / max(1, int(args.world_size))
        tokens, samples = int(tokens), int(samples)
        now = rec.clock.now()
        if not math.isfinite(loss):
            raise Diverged(f"training loss became {loss} at step {step}")
        res.optimizer_step_seconds.append(now - rec.last_micro_end)
        step_seconds = now - rec.mark
        res.step_seconds.append(step_seconds)
        res.train_losses.append([step, loss])
        grad_norm, rec.step_grad_norm = rec.step_grad_norm, None
        if grad_norm is not None:
            res.grad_norms.append([step, grad_norm])
        res.tokens_seen += tokens
        res.samples_seen += samples
        rec.step_tokens = rec.step_samples = 0
        rec.step_loss = torch.zeros(())
        rec.mark = now
        res.final_step = step
        if res.device != "cuda":
            rec.peak_rss = max(rec.peak_rss, rss_bytes())
        lr = float(kwargs["lr_scheduler"].get_last_lr()[0]) if kwargs.get("lr_scheduler") else 0.0
        info = StepInfo(
            step=step,
            total_steps=res.total_steps,
            loss=loss,
            learning_rate=lr,
            seconds=step_seconds,
            tokens=tokens,
            elapsed_seconds=now - self.wall_start,
            grad_norm=grad_norm,
        )
        self.guard.on_step(info)
        forecast = self.guard.forecast(step) if self.report_forecasts else None
        if forecast is not None and self.guard.should_report(forecast):
            log.info("%s", forecast.line())
            if forecast.recommendation and self.on_track:  # once each time it falls behind
                log.warning("%s", forecast.recommendation)
            self.on_track = forecast.on_track
            for callback in self.callbacks:
                callback.on_forecast(forecast)
        self.fan_out("on_step", info, control)
        if forecast is not None and forecast.should_stop:
            log.warning(
                "stopping at step %d of %d to save a checkpoint before the window ends",
                step,
                res.total_steps,
            )
            self.request_stop(control, "window", "stopped_by_window")
        if self.checkpoint_minutes > 0 and now - self.last_save >= 60 * self.checkpoint_minutes:
            control.should_save = True
        if self.stop_after_steps is not None and step >= self.stop_after_steps:
            # The planned end of a trial, not a stop request: the run still ends with an
            # evaluation at this step and counts as finished.
            control.should_training_stop = True
        if self.checkpointing and step >= state.max_steps:
            control.should_save = True  # the finished adapter, whatever the intervals
        self._agree(control)

    def _agree(self, control: Any) -> None:
        """Take a stop or a save that any process decided at this step, on every process."""
        res = self.rec.result
        status = res.status if res.stop_reason is not None else ""
        code = distributed.STOP_PRIORITY.index(status) if status in distributed.STOP_PRIORITY else 1
        # The signal's number travels too: torchrun sends a SIGTERM to every process, but one
        # may take it a step before the others, and the run was still stopped by SIGTERM.
        signum = _signal_number(res.stop_reason) if status == "stopped_by_signal" else 0
        agreed, stop, save, agreed_signum = distributed.highest(
            [code, int(control.should_training_stop), int(control.should_save), signum]
        )
        if agreed and res.stop_reason is None:
            reason = (
                signal.Signals(agreed_signum).name
                if agreed_signum and distributed.STOP_PRIORITY[agreed] == "stopped_by_signal"
                else "stopped by another process"
            )
            self.request_stop(control, reason, distributed.STOP_PRIORITY[agreed])
        control.should_training_stop = bool(stop or agreed)
        control.should_save = bool(save or control.should_save)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.rec.last_checkpoint is None:
            return
        path, seconds = self.rec.last_checkpoint
        self.last_save = self.rec.mark
        step = int(state.global_step)
        self.guard.on_checkpoint(step, path, seconds)
        for callback in self.callbacks:
            if callback.on_checkpoint(step, path, seconds):
                control.should_training_stop = True


def _signal_number(name: str | None) -> int:
    """The number of a signal named like "SIGTERM" (0 for anything else)."""
    try:
        return int(signal.Signals[name or ""].value)
    except KeyError:
        return 0


def rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _skip_redundant_mode_switches(model: torch.nn.Module) -> None:
    """Make `model.train()` a no-op once it has put the whole tree in training mode.

    The Trainer calls it before every micro-step, and each call walks every submodule
    (~9 % of a tiny model's step time). The first call still walks: a PEFT wrapper is made
    with `training` True over a base loaded in eval mode, and skipping that walk left every
    layer in eval mode (no gradient checkpointing, no LoRA dropout). `eval()` calls
    `train(False)`, and the next `train()` then walks the tree again.
    """
    switch = model.train
    walked = False  # the last call through this wrapper walked the tree with mode True

    def train(mode: bool = True) -> torch.nn.Module:
        nonlocal walked
        if mode and walked and model.training:
            return model
        walked = mode
        return switch(mode)

    model.train = train  # type: ignore[method-assign]
