"""The Trainer for one attempt of a run: datasets, collators (padding or packing), arguments.

A run builds a new Trainer for each attempt (the first, and each restart after a recovery),
with the micro-batch, accumulation and learning rate the recovery state says.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from transformers import TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from trainers.data.dataset import Example, TokenizedData
from trainers.data.packing import PackedSequence, PaddingFreeCollator, pack_examples
from trainers.loop.data_loading import DataLoading, choose_data_loading
from trainers.loop.measured import MeasuredTrainer, TrainerHooks
from trainers.loop.recovery import RecoveryState
from trainers.model.runtime import RuntimeChoice
from trainers.spec import TrainSpec, eval_batch_size


class ListDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, examples: Sequence[Example | PackedSequence]) -> None:
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> Example | PackedSequence:
        return self.examples[index]


def training_items(spec: TrainSpec, data: TokenizedData) -> list[Example] | list[PackedSequence]:
    """What one training micro-batch slot holds: a sample, or a packed sequence of samples."""
    if spec.packing == "padding_free":
        return pack_examples(data.train, spec.max_length)
    return list(data.train)


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


def build_trainer(
    spec: TrainSpec,
    recovery: RecoveryState,
    runtime: RuntimeChoice,
    model: Any,
    data: TokenizedData,
    tokenizer: Any,
    hooks: TrainerHooks,
    data_loading: DataLoading | None = None,
) -> MeasuredTrainer:
    """A Trainer for the next attempt, with the micro-batch and learning rate recovery chose."""
    attempt = dataclasses.replace(
        spec,
        micro_batch_size=recovery.micro_batch_size,
        gradient_accumulation_steps=recovery.gradient_accumulation_steps,
        learning_rate=spec.learning_rate * recovery.lr_scale,
    )
    pad = PadCollator(int(tokenizer.pad_token_id))
    trainer = MeasuredTrainer(
        model=model,
        args=training_arguments(attempt, runtime, data_loading),
        train_dataset=ListDataset(training_items(spec, data)),
        eval_dataset=ListDataset(data.validation[: spec.eval_samples]),
        data_collator=PaddingFreeCollator() if spec.packing == "padding_free" else pad,
        callbacks=[hooks.bridge],
        hooks=hooks,
        eval_collator=pad,  # validation is never packed: one protocol for every run
    )
    # The Trainer's own printer/progress output would interleave with ours.
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def training_arguments(
    spec: TrainSpec, runtime: RuntimeChoice, data_loading: DataLoading | None = None
) -> TrainingArguments:
    loading = data_loading or choose_data_loading(runtime.device, 1, spec.dataloader_workers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = TrainingArguments(
            output_dir=spec.output_dir,
            per_device_train_batch_size=spec.micro_batch_size,
            per_device_eval_batch_size=eval_batch_size(spec.micro_batch_size),
            gradient_accumulation_steps=spec.gradient_accumulation_steps,
            learning_rate=spec.learning_rate,
            weight_decay=spec.weight_decay,
            lr_scheduler_type=spec.scheduler,
            warmup_steps=spec.warmup_ratio,
            max_steps=spec.max_steps if spec.max_steps is not None else -1,
            num_train_epochs=spec.epochs,
            eval_strategy="steps" if spec.eval_interval > 0 else "no",
            eval_steps=spec.eval_interval if spec.eval_interval > 0 else None,
            # Saves at these steps; MeasuredTrainer writes and rotates them (keep_checkpoints).
            save_strategy="steps" if spec.checkpoint_interval > 0 else "no",
            save_steps=spec.checkpoint_interval if spec.checkpoint_interval > 0 else 500,
            logging_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=spec.seed,
            gradient_checkpointing=spec.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False}
            if spec.gradient_checkpointing
            else None,
            remove_unused_columns=False,
            max_grad_norm=spec.max_grad_norm,
            # Micro-batches of samples of about one length: less padding, and on several
            # GPUs less waiting for the one whose batch is longest (MeasuredTrainer gives the
            # sampler the lengths).
            train_sampling_strategy="group_by_length"
            if spec.packing == "group_by_length"
            else "random",
            # Every adapter weight takes part in every forward pass: DDP need not search the
            # graph for unused ones at each step.
            ddp_find_unused_parameters=False if spec.gpus > 1 else None,
            # Both set pin_memory (pinned for CUDA only); the runtime's choice wins.
            **{**loading.training_arguments(), **runtime.training_arguments()},
        )
    return one_gpu_per_process(args)


def one_gpu_per_process(args: TrainingArguments) -> TrainingArguments:
    """`args` training on one GPU per process, however many this process sees.

    A single process that sees several GPUs (a node's, without CUDA_VISIBLE_DEVICES) gets
    `n_gpu` = all of them from transformers, and its Trainer wraps the model in
    `nn.DataParallel` and multiplies the micro-batch by that count: another batch, schedule
    and speed than the configuration's, and a study's trials would measure it as this one's.
    Several GPUs are the data-parallel run's (`--gpus N`, one process each, n_gpu 1 there).
    transformers has no argument for it; `_n_gpu` is what its Trainer itself sets to 1 for a
    model split over GPUs.
    """
    _ = args.device  # sets `_n_gpu` (a cached property): set after it, the value stays
    if args.n_gpu > 1:
        args._n_gpu = 1
    return args
