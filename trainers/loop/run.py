"""One training run: data, model + LoRA, transformers' Trainer, measurements, recovery.

The Trainer does the loop (`trainers.loop.measured` times it and bridges its events to plain
callbacks). This module sets the run up, resumes it from a verified checkpoint, and, when
recovery is on, restarts it after out-of-memory errors or a diverging loss
(`trainers.loop.recovery` decides how).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from common.errors import BadInputError, Diverged, GaveUp, TrainingFailed
from trainers.events import RunInfo, TrainingCallback
from trainers.loop import checkpoint, distributed
from trainers.loop.data_loading import available_cpus, choose_data_loading
from trainers.loop.early_stopping import EarlyStopping, advise
from trainers.loop.inputs import Attached, RunInputs
from trainers.loop.measured import Bridge, Clock, Recorder, TrainerHooks, now_iso, rss_bytes
from trainers.loop.recovery import DivergenceMonitor, RecoveryState
from trainers.loop.trainer_setup import build_trainer
from trainers.loop.window import WindowGuard
from trainers.model.runtime import RuntimeChoice, detect_runtime
from trainers.result import TrainResult
from trainers.spec import TrainSpec

log = logging.getLogger(__name__)


def train(
    spec: TrainSpec,
    callbacks: Sequence[TrainingCallback] = (),
    *,
    resume: bool = False,
    window: WindowGuard | None = None,
    inputs: RunInputs | None = None,
) -> TrainResult:
    """Run one LoRA training described by `spec`.

    Args:
        spec: The run.
        callbacks: Plain callbacks; any hook may return True to stop the run.
        resume: Continue from the newest valid checkpoint in `spec.output_dir`.
        window: Forecasts the end after every step and stops the run (with a checkpoint)
            before its window closes; forecasts are logged and sent to `on_forecast`.
        inputs: Tokenizer, data and base model kept from earlier runs of this process (a
            study's worker); the run attaches its adapter to that base model and takes it
            off at its end. Default: loaded for this run alone.

    Raises:
        BadInputError: The model, data or a setting is unusable; `resume` without a valid
            checkpoint; a fresh run into a folder that holds checkpoints.
        TrainingFailed: The loss became NaN/inf or the device ran out of memory (recovery
            off), or recovery gave up (`GaveUp`, carrying the partial result).
    """
    from transformers import set_seed

    wall_start = time.perf_counter()
    check_processes(spec, distributed.processes())
    resume_dir = _starting_checkpoint(spec, resume)
    saved = checkpoint.read_run_state(resume_dir) if resume_dir else {}
    runtime = detect_runtime(spec.device, spec.precision, spec.compile)
    set_seed(spec.seed)
    inputs = inputs or RunInputs(keep_base=False)
    loaded = inputs.attach(spec, runtime.device, runtime.precision)
    try:
        return _train_attached(
            spec, callbacks, resume_dir, saved, window, runtime, loaded, wall_start
        )
    finally:
        inputs.release(compiled=runtime.compile)


def _train_attached(
    spec: TrainSpec,
    callbacks: Sequence[TrainingCallback],
    resume_dir: Path | None,
    saved: dict[str, Any],
    window: WindowGuard | None,
    runtime: RuntimeChoice,
    loaded: Attached,
    wall_start: float,
) -> TrainResult:
    # Logged once the inputs are known good, so a bad-input error stays the only line.
    log.info("runtime: %s; %s", runtime.reason, loaded.levers.reason)
    if runtime.device == "cuda":
        # Blocks an earlier trial of this worker left cached would count as reserved here; a
        # full run starts with none.
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start_memory = torch.cuda.memory_allocated() if runtime.device == "cuda" else rss_bytes()
    if saved:
        log.info("resuming from %s (step %d)", resume_dir, saved["step"])

    clock = Clock(runtime.device)
    recovery = RecoveryState.from_dict(saved) if saved else RecoveryState.from_spec(spec)
    result = _new_result(spec, runtime, loaded, recovery, saved, resume_dir)
    result.start_memory_bytes = int(start_memory)
    loading = choose_data_loading(runtime.device, available_cpus(), spec.dataloader_workers)
    result.data_loading = loading.to_dict()
    log.info("data loader: %s", loading.reason)
    early_stopping = _early_stopping(spec, saved)
    previous_wall = float(saved.get("cumulative_wall_seconds", 0.0))
    run_state = RunStateWriter(
        result, recovery, clock, wall_start, previous_wall, early_stopping, gpus=spec.gpus
    )
    hooks = _trainer_hooks(spec, callbacks, window, run_state)
    recorder, bridge = hooks.recorder, hooks.bridge
    initial_adapter = _trainable_state(loaded.model) if spec.recovery.enabled else {}
    saved_lr_scale = float(saved.get("lr_scale", 1.0))

    def close() -> TrainResult:
        begin = bridge.train_begin or clock.now()
        _finish(result, recorder, begin - wall_start, clock.now() - wall_start, previous_wall)
        result.micro_batch_size = recovery.micro_batch_size
        result.gradient_accumulation_steps = recovery.gradient_accumulation_steps
        _best_and_advice(result, spec, spec.learning_rate * recovery.lr_scale)
        for callback in callbacks:
            callback.on_train_end(result)
        return result

    while True:
        hooks.lr_ratio_on_load = recovery.lr_scale / saved_lr_scale
        trainer = build_trainer(
            spec, recovery, runtime, loaded.model, loaded.data, loaded.tokenizer, hooks, loading
        )
        try:
            _train_to_the_end(trainer, resume_dir, result)
            break
        except (torch.OutOfMemoryError, Diverged) as exc:
            try:
                reason = _recovery_reason(exc, spec, recovery, runtime, trainer)
            except GaveUp as gave_up:
                result.status, result.stop_reason = "gave_up", str(gave_up)
                gave_up.result = close()
                raise gave_up from exc
            safe_step = exc.safe_step if isinstance(exc, Diverged) else None
        del trainer
        resume_dir, back_to, saved_lr_scale = _restart_point(
            spec, loaded.model, initial_adapter, safe_step
        )
        _forget_after(result, hooks.divergence, back_to)
        if early_stopping is not None:
            early_stopping.replay(result.eval_losses)
        log.warning("recovery: %s; continuing from step %d", reason, back_to)
        if runtime.device == "cuda":
            torch.cuda.empty_cache()
    return close()


def _new_result(
    spec: TrainSpec,
    runtime: RuntimeChoice,
    loaded: Attached,
    recovery: RecoveryState,
    saved: dict[str, Any],
    resume_dir: Path | None,
) -> TrainResult:
    model = dataclasses.asdict(loaded.info)  # parameters, layers, LoRA targets
    model["lora_targets"] = list(model["lora_targets"])
    return TrainResult(
        device=runtime.device,
        precision=runtime.precision,
        runtime_reason=runtime.reason,
        **model,
        micro_batch_size=recovery.micro_batch_size,
        gradient_accumulation_steps=recovery.gradient_accumulation_steps,
        max_length=spec.max_length,
        lora_r=spec.lora.r,
        gradient_checkpointing=spec.gradient_checkpointing,
        quantization=spec.quantization,
        levers=list(loaded.levers.names),
        dataset={k: v for k, v in loaded.data.stats.to_dict().items() if k != "lengths"},
        resumed_from_step=saved.get("step"),
        recoveries=recovery.recoveries,
        checkpoint_dir=str(resume_dir.resolve()) if resume_dir else None,
        reused_base_model=not loaded.loaded_base,
    )


@dataclasses.dataclass
class RunStateWriter:
    """The `run_state.json` of a checkpoint saved at some step: what a resume needs."""

    result: TrainResult
    recovery: RecoveryState
    clock: Clock
    wall_start: float
    previous_wall: float  # the wall time of the runs this one resumed from
    early_stopping: EarlyStopping | None = None
    gpus: int = 1  # a resume must run on as many processes (each owns its data shard)

    def __call__(self, step: int) -> dict[str, Any]:
        result = self.result
        last_eval = result.eval_losses[-1] if result.eval_losses else None
        return {
            "step": step,
            "gpus": self.gpus,
            **self.recovery.to_dict(),
            "train_loss": result.train_losses[-1][1] if result.train_losses else None,
            "val_loss": last_eval[1] if last_eval and last_eval[0] == step else None,
            "last_val_loss": list(last_eval) if last_eval else None,
            "cumulative_wall_seconds": self.previous_wall + self.clock.now() - self.wall_start,
            "saved_at": now_iso(),
            "early_stopping": self.early_stopping.to_dict() if self.early_stopping else None,
        }


def _trainer_hooks(
    spec: TrainSpec,
    callbacks: Sequence[TrainingCallback],
    window: WindowGuard | None,
    run_state: RunStateWriter,
) -> TrainerHooks:
    """What every attempt's Trainer shares: the measurements, the callbacks, the saved state."""
    result = run_state.result
    recorder = Recorder(result, run_state.clock)
    bridge = Bridge(
        recorder,
        callbacks,
        window or WindowGuard(),
        wall_start=run_state.wall_start,
        run_info=functools.partial(_run_info, spec, result),
        checkpointing=spec.checkpointing,
        checkpoint_minutes=spec.checkpoint_minutes,
        report_forecasts=window is not None,
        stop_after_steps=spec.stop_after_steps,
    )
    recovery = spec.recovery
    return TrainerHooks(
        recorder=recorder,
        bridge=bridge,
        keep_checkpoints=spec.keep_checkpoints,
        run_state=run_state,
        divergence=DivergenceMonitor(recovery.divergence_ratio, recovery.divergence_evals)
        if recovery.enabled
        else None,
        early_stopping=run_state.early_stopping,
    )


def _early_stopping(spec: TrainSpec, saved: dict[str, Any]) -> EarlyStopping | None:
    """The early-stopping state: fresh, or where the checkpoint a run resumes from left it."""
    if spec.early_stopping_patience <= 0:
        return None
    stopping = EarlyStopping(spec.early_stopping_patience, spec.early_stopping_min_delta)
    before = saved.get("early_stopping") or {}
    stopping.best_loss = before.get("best_loss")
    stopping.best_step = before.get("best_step")
    stopping.evals_without_improvement = int(before.get("evals_without_improvement", 0))
    return stopping


def _best_and_advice(result: TrainResult, spec: TrainSpec, learning_rate: float) -> None:
    """The best evaluation and its kept checkpoint; what the curves advise (logged).

    `learning_rate` is the one the run ended with (recovery's rollbacks lower it).
    """
    result.max_grad_norm = spec.max_grad_norm
    if result.eval_losses:
        step, loss = min(result.eval_losses, key=lambda x: x[1])
        result.best_step, result.best_val_loss = int(step), float(loss)
    if spec.checkpointing:
        best = checkpoint.best_checkpoint(spec.output_dir)
        result.best_checkpoint = str(best.resolve()) if best else None
    # A rollback leaves the abandoned branch's records: the last record of each step counts.
    by_step = {int(r["step"]): (float(r["loss"]), r.get("train_loss")) for r in result.eval_records}
    kept = {int(step) for step, _ in result.eval_losses}
    if spec.stop_after_steps is not None:
        return  # a trial is cut short on purpose: advice on its curve would be noise
    gave_up = result.stop_reason if result.status == "gave_up" else None
    evals = [(s, *by_step[s]) for s in sorted(by_step) if s in kept]
    stopped_early = result.status == "stopped_early"
    result.advice = advise(
        evals, learning_rate=learning_rate, gave_up=gave_up, stopped_early=stopped_early,
        min_delta=spec.early_stopping_min_delta,
    )  # fmt: skip
    for line in result.advice:
        log.warning("advice: %s", line)


def _run_info(spec: TrainSpec, result: TrainResult, total_steps: int, start_step: int) -> RunInfo:
    return RunInfo(
        total_steps=total_steps,
        trainable_parameters=result.trainable_parameters,
        total_parameters=result.total_parameters,
        device=result.device,
        precision=result.precision,
        start_step=start_step,
        eval_interval=spec.eval_interval,
        checkpoint_interval=spec.checkpoint_interval,
        checkpoint_minutes=spec.checkpoint_minutes,
    )


def _train_to_the_end(trainer: Any, resume_dir: Path | None, result: TrainResult) -> None:
    """One attempt; the final step is always evaluated (unless a callback stopped the run)."""
    trainer.train(resume_from_checkpoint=str(resume_dir) if resume_dir else None)
    last_eval = result.eval_losses[-1][0] if result.eval_losses else -1
    if last_eval != trainer.state.global_step and result.stop_reason is None:
        trainer.evaluate()


def _recovery_reason(
    exc: BaseException,
    spec: TrainSpec,
    recovery: RecoveryState,
    runtime: RuntimeChoice,
    trainer: Any,
) -> str:
    """What recovery changes after `exc`; re-raises when recovery is off.

    Raises:
        Diverged: Recovery is off and the loss diverged.
        TrainingFailed: Recovery is off and the device ran out of memory.
        GaveUp: Recovery ran out of options.
    """
    if not spec.recovery.enabled:
        if isinstance(exc, Diverged):
            raise exc
        raise TrainingFailed(f"out of memory on {runtime.device}: {exc}") from exc
    if isinstance(exc, Diverged):
        return recovery.after_divergence(str(exc), spec.recovery)
    return recovery.after_out_of_memory(_first_line(exc), int(trainer.state.global_step))


def _forget_after(result: TrainResult, divergence: DivergenceMonitor | None, back_to: int) -> None:
    """Drop what the abandoned branch measured after the step the run continues from."""
    result.train_losses[:] = [x for x in result.train_losses if x[0] <= back_to]
    result.eval_losses[:] = [x for x in result.eval_losses if x[0] <= back_to]
    if divergence is not None:
        divergence.forget_after(back_to)


def check_processes(spec: TrainSpec, processes: distributed.Processes) -> None:
    """A run on N GPUs must be launched as N processes (`trainers.train` does it itself).

    Raises:
        BadInputError: The launcher started another number of processes.
    """
    if processes.world_size != spec.gpus:
        raise BadInputError(
            f"this run asks for gpus={spec.gpus}, but it was launched as "
            f"{processes.world_size} process(es): give --gpus {processes.world_size} (the "
            f"effective batch then is {processes.world_size} x micro-batch x accumulation), or "
            "run `python -m trainers.train` without torchrun and it starts the processes itself"
        )


def _starting_checkpoint(spec: TrainSpec, resume: bool) -> Path | None:
    """The verified checkpoint a resumed run starts from; checks a fresh run's folder."""
    out = Path(spec.output_dir)
    if resume:
        found = checkpoint.latest_valid(out)
        if found is None:
            raise BadInputError(f"cannot resume: no valid checkpoint in {out}")
        rank = json.loads((found / "adapter_config.json").read_text(encoding="utf-8")).get("r")
        if rank != spec.lora.r:
            raise BadInputError(
                f"cannot resume: {found} holds a LoRA adapter of rank {rank}, "
                f"but this run asks for lora.r={spec.lora.r}"
            )
        gpus = int(checkpoint.read_run_state(found).get("gpus", 1))
        if gpus != spec.gpus:
            raise BadInputError(
                f"cannot resume: {found} was saved by a run on {gpus} GPU(s), but this run asks "
                f"for gpus={spec.gpus}: resume with --gpus {gpus} (the data order and the "
                "effective batch depend on it)"
            )
        if distributed.processes().main:  # the others find the folder as process 0 left it
            checkpoint.clean_staging(out)
        return found
    existing = checkpoint.checkpoints(out)
    if existing:
        raise BadInputError(
            f"{out} already holds checkpoints (newest: {existing[-1][1].name}); "
            "resume them (--resume) or choose another output folder"
        )
    return None


def _restart_point(
    spec: TrainSpec, model: Any, initial_adapter: dict[str, torch.Tensor], safe_step: int | None
) -> tuple[Path | None, int, float]:
    """After a failure: where to continue (checkpoint, step, its learning-rate scale).

    Without a checkpoint (at or before `safe_step`), the adapter weights and the seed are
    reset and the run starts over: (None, 0, 1.0).
    """
    from transformers import set_seed

    out = Path(spec.output_dir)
    gc.collect()
    found = checkpoint.latest_valid(out, at_most_step=safe_step)
    state = checkpoint.read_run_state(found) if found else {"step": 0, "lr_scale": 1.0}
    checkpoint.discard_after(out, int(state["step"]))  # the abandoned branch
    if found is None:
        # No checkpoint yet: start over from the initial adapter weights and seed.
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name in initial_adapter:
                    param.copy_(initial_adapter[name])
        set_seed(spec.seed)
    return found, int(state["step"]), float(state["lr_scale"])


def _trainable_state(model: Any) -> dict[str, torch.Tensor]:
    """A copy of the trainable (adapter) weights; small for LoRA."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _finish(
    result: TrainResult, recorder: Recorder, startup: float, wall: float, previous_wall: float
) -> None:
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
    result.cumulative_wall_seconds = previous_wall + wall
    train_seconds = sum(result.step_seconds)
    result.tokens_per_second = result.tokens_seen / train_seconds if train_seconds > 0 else 0.0
    result.final_train_loss = result.train_losses[-1][1] if result.train_losses else None
    result.final_eval_loss = result.eval_losses[-1][1] if result.eval_losses else None
    if result.status == "stopped" and result.final_step >= result.total_steps:
        result.status = "finished"  # a stop request at the last step changes nothing
    if result.device == "cuda":
        result.peak_memory_bytes = int(torch.cuda.max_memory_allocated())
        result.peak_reserved_bytes = int(torch.cuda.max_memory_reserved())
    else:
        result.peak_memory_bytes = max(recorder.peak_rss, rss_bytes())
