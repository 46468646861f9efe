"""One training run: data, model + LoRA, transformers' Trainer, measurements.

The Trainer does the loop; a thin subclass times each micro-step (forward + backward) and
each evaluation, and a bridge callback turns Trainer events into the plain callbacks of
`trainers.callbacks`, samples memory and honours stop requests.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from trainers.callbacks import EvalInfo, RunInfo, StepInfo, TrainingCallback
from trainers.data import DataSpec, Example, load_tokenized
from trainers.errors import BadInputError, TrainingFailed
from trainers.lora import apply_lora, load_base_model
from trainers.result import TrainResult
from trainers.runtime import RuntimeChoice, detect_runtime
from trainers.spec import TrainSpec

log = logging.getLogger(__name__)


class _ListDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, examples: Sequence[Example]) -> None:
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> Example:
        return self.examples[index]


class PadCollator:
    """Pads a micro-batch to its longest sample (dynamic padding)."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, batch: Sequence[Example]) -> dict[str, torch.Tensor]:
        width = max(len(e.input_ids) for e in batch)
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, example in enumerate(batch):
            n = len(example.input_ids)
            ids[row, :n] = torch.tensor(example.input_ids, dtype=torch.long)
            labels[row, :n] = torch.tensor(example.labels, dtype=torch.long)
            mask[row, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


class _Clock:
    """Wall clock that waits for queued GPU work, so timings are real on CUDA."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


class _Recorder:
    """Collects measurements while the Trainer runs."""

    def __init__(self, result: TrainResult, clock: _Clock) -> None:
        self.result = result
        self.clock = clock
        self.step_loss = torch.zeros(())
        self.step_tokens = 0
        self.last_micro_end = 0.0
        self.mark = 0.0  # end of the last step, evaluation or save
        self.pending_overhead = 0.0  # eval/save seconds inside the current step interval
        self.peak_rss = 0


class _MeasuredTrainer(Trainer):
    recorder: _Recorder

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
        # Trainer scales each micro-step loss so that their sum is the optimizer-step loss.
        rec.step_loss = rec.step_loss + loss.detach().float().cpu()
        rec.last_micro_end = end
        return loss

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        rec = self.recorder
        start = rec.clock.now()
        metrics = super().evaluate(*args, **kwargs)
        end = rec.clock.now()
        seconds = end - start
        step = self.state.global_step
        loss = float(metrics["eval_loss"])
        n_tokens = sum(len(e.input_ids) for e in self.eval_dataset)  # type: ignore[union-attr, arg-type]
        rec.result.eval_losses.append([step, loss])
        rec.result.eval_records.append(
            {"step": step, "loss": loss, "seconds": seconds, "tokens": n_tokens}
        )
        rec.pending_overhead += seconds
        rec.mark = end
        bridge = next(c for c in self.callback_handler.callbacks if isinstance(c, _Bridge))
        bridge.fan_out("on_eval", EvalInfo(step=step, loss=loss, seconds=seconds), self.control)
        return metrics


class _Bridge(TrainerCallback):
    """Trainer events -> plain callbacks, memory sampling, stop requests."""

    def __init__(
        self, recorder: _Recorder, callbacks: Sequence[TrainingCallback], wall_start: float
    ) -> None:
        self.rec = recorder
        self.callbacks = list(callbacks)
        self.wall_start = wall_start
        self.train_begin = 0.0

    def fan_out(self, hook: str, payload: Any, control: Any) -> None:
        for callback in self.callbacks:
            if getattr(callback, hook)(payload):
                control.should_training_stop = True
                if self.rec.result.stop_reason is None:
                    self.rec.result.stop_reason = f"{type(callback).__name__}.{hook}"

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        res = self.rec.result
        res.total_steps = int(state.max_steps)
        self.train_begin = self.rec.clock.now()
        self.rec.mark = self.train_begin
        info = RunInfo(
            total_steps=res.total_steps,
            trainable_parameters=res.trainable_parameters,
            total_parameters=res.total_parameters,
            device=res.device,
            precision=res.precision,
        )
        self.fan_out("on_train_begin", info, control)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        rec, res = self.rec, self.rec.result
        now = rec.clock.now()
        step = int(state.global_step)
        loss = float(rec.step_loss)
        if not math.isfinite(loss):
            raise TrainingFailed(f"training loss became {loss} at step {step}")
        res.optimizer_step_seconds.append(now - rec.last_micro_end)
        step_seconds = now - rec.mark - rec.pending_overhead
        rec.pending_overhead = 0.0
        res.step_seconds.append(step_seconds)
        res.train_losses.append([step, loss])
        res.tokens_seen += rec.step_tokens
        tokens, rec.step_tokens = rec.step_tokens, 0
        rec.step_loss = torch.zeros(())
        rec.mark = now
        if res.device != "cuda":
            rec.peak_rss = max(rec.peak_rss, _rss_bytes())
        lr = float(kwargs["lr_scheduler"].get_last_lr()[0]) if kwargs.get("lr_scheduler") else 0.0
        info = StepInfo(
            step=step,
            total_steps=res.total_steps,
            loss=loss,
            learning_rate=lr,
            seconds=step_seconds,
            tokens=tokens,
            elapsed_seconds=now - self.wall_start,
        )
        self.fan_out("on_step", info, control)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = self.rec.clock.now()
        seconds = now - self.rec.mark
        self.rec.result.checkpoint_seconds.append(seconds)
        self.rec.pending_overhead += seconds
        self.rec.mark = now
        path = f"{args.output_dir}/checkpoint-{state.global_step}"
        for callback in self.callbacks:
            if callback.on_checkpoint(int(state.global_step), path, seconds):
                control.should_training_stop = True


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def train(spec: TrainSpec, callbacks: Sequence[TrainingCallback] = ()) -> TrainResult:
    """Run one LoRA training described by `spec`.

    Raises:
        BadInputError: the model, data or a setting is unusable.
        TrainingFailed: the loss became NaN/inf or the device ran out of memory.
    """
    from transformers import set_seed
    from transformers.utils import logging as hf_logging

    wall_start = time.perf_counter()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # "Loading weights" bars, once per trial
    runtime = detect_runtime(spec.device, spec.precision, spec.compile)
    log.info("runtime: %s", runtime.reason)
    set_seed(spec.seed)

    tokenizer = _load_tokenizer(spec.model)
    data = load_tokenized(
        DataSpec(
            path=spec.data,
            max_length=spec.max_length,
            overflow=spec.overflow,
            skip_bad_lines=spec.skip_bad_lines,
            validation_fraction=spec.validation_fraction,
            seed=spec.seed,
            cache_dir=spec.cache_dir,
        ),
        tokenizer,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecations inside transformers/PEFT
        base = load_base_model(spec.model)
        model, info = apply_lora(base, spec.lora)
    if runtime.device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    clock = _Clock(runtime.device)
    result = TrainResult(
        device=runtime.device,
        precision=runtime.precision,
        runtime_reason=runtime.reason,
        trainable_parameters=info.trainable_parameters,
        total_parameters=info.total_parameters,
        lora_targets=list(info.lora_targets),
        lora_parameters_per_rank=info.lora_parameters_per_rank,
        n_layers=info.n_layers,
        hidden_size=info.hidden_size,
        vocab_size=info.vocab_size,
        micro_batch_size=spec.micro_batch_size,
        gradient_accumulation_steps=spec.gradient_accumulation_steps,
        max_length=spec.max_length,
        lora_r=spec.lora.r,
        gradient_checkpointing=spec.gradient_checkpointing,
        dataset={k: v for k, v in data.stats.to_dict().items() if k != "lengths"},
    )
    recorder = _Recorder(result, clock)
    bridge = _Bridge(recorder, callbacks, wall_start)
    trainer = _MeasuredTrainer(
        model=model,
        args=_training_arguments(spec, runtime),
        train_dataset=_ListDataset(data.train),
        eval_dataset=_ListDataset(data.validation[: spec.eval_samples]),
        data_collator=PadCollator(int(tokenizer.pad_token_id)),
        callbacks=[bridge],
    )
    trainer.recorder = recorder
    # The Trainer's own printer/progress output would interleave with ours.
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)

    try:
        trainer.train()
        last_eval = result.eval_losses[-1][0] if result.eval_losses else -1
        if last_eval != trainer.state.global_step and result.stop_reason is None:
            trainer.evaluate()
    except torch.OutOfMemoryError as exc:
        raise TrainingFailed(f"out of memory on {runtime.device}: {exc}") from exc

    wall_end = clock.now()
    _finish(result, recorder, bridge.train_begin - wall_start, wall_end - wall_start)
    for callback in callbacks:
        callback.on_train_end(result)
    return result


def _finish(result: TrainResult, recorder: _Recorder, startup: float, wall: float) -> None:
    result.optimizer_steps = len(result.step_seconds)
    result.startup_seconds = startup
    eval_seconds = sum(r["seconds"] for r in result.eval_records)
    checkpoint_seconds = sum(result.checkpoint_seconds)
    result.timings = {
        "startup": startup,
        "eval": eval_seconds,
        "checkpoint": checkpoint_seconds,
        # Everything else: the steps themselves, data loading and the loop's own bookkeeping.
        "train": wall - startup - eval_seconds - checkpoint_seconds,
    }
    result.wall_seconds = wall
    train_seconds = sum(result.step_seconds)
    result.tokens_per_second = result.tokens_seen / train_seconds if train_seconds > 0 else 0.0
    result.final_train_loss = result.train_losses[-1][1] if result.train_losses else None
    result.final_eval_loss = result.eval_losses[-1][1] if result.eval_losses else None
    if result.device == "cuda":
        result.peak_memory_bytes = int(torch.cuda.max_memory_allocated())
    else:
        result.peak_memory_bytes = max(recorder.peak_rss, _rss_bytes())


def _load_tokenizer(path: str) -> Any:
    from pathlib import Path

    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise BadInputError(f"model folder not found: {path}")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _training_arguments(spec: TrainSpec, runtime: RuntimeChoice) -> TrainingArguments:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TrainingArguments(
            output_dir=spec.output_dir,
            per_device_train_batch_size=spec.micro_batch_size,
            per_device_eval_batch_size=spec.micro_batch_size,
            gradient_accumulation_steps=spec.gradient_accumulation_steps,
            learning_rate=spec.learning_rate,
            weight_decay=spec.weight_decay,
            lr_scheduler_type=spec.scheduler,
            warmup_steps=spec.warmup_ratio,
            max_steps=spec.max_steps if spec.max_steps is not None else -1,
            num_train_epochs=spec.epochs,
            eval_strategy="steps" if spec.eval_interval > 0 else "no",
            eval_steps=spec.eval_interval if spec.eval_interval > 0 else None,
            save_strategy="steps" if spec.checkpoint_interval > 0 else "no",
            save_steps=spec.checkpoint_interval if spec.checkpoint_interval > 0 else 500,
            save_total_limit=2,
            logging_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=spec.seed,
            gradient_checkpointing=spec.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False}
            if spec.gradient_checkpointing
            else None,
            remove_unused_columns=False,
            dataloader_num_workers=0,
            **runtime.training_arguments(),
        )
