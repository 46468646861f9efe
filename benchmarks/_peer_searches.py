"""What a user would run instead of `hpo.study`: three searches that know nothing of the window.

Each searches the default space (`search_spaces.sample`: profile, then its micro-batch and
accumulation, learning rate, LoRA rank, alpha ratio and dropout) with fixed-step trials
scored by their validation loss after `PEER_TRIAL_STEPS` optimizer steps, no pruning, for a
wall-clock budget, into an Optuna storage the benchmark reads afterwards:

- `hf_search`: transformers' `Trainer.hyperparameter_search(backend="optuna")`, LoRA through
  `model_init(trial)` with PEFT directly (as a user's script would);
- `optuna_search`: plain Optuna with the project's trainer per trial; with TPE and
  optuna-integration's `MLflowCallback`, or with the `RandomSampler` (random search).
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
from pathlib import Path
from typing import Any

import optuna

from common.workdir import WorkDir
from hpo.config import StudyConfig
from hpo.prepare import Prepared
from hpo.trial_runs import full_run
from search_spaces import sample

PEER_TRIAL_STEPS = 30  # a fixed-step trial, as a user would set `max_steps`
HF_EVAL_BATCH = 8


def trial_spec(
    config: StudyConfig, params: dict[str, Any], prepared: Prepared, output_dir: Path
) -> Any:
    """The configuration's training, cut to `PEER_TRIAL_STEPS` with its own schedule."""
    spec = full_run(
        config,
        params,
        model=prepared.model_path,
        data=prepared.data_path,
        output_dir=str(output_dir),
    )
    return dataclasses.replace(
        spec, max_steps=PEER_TRIAL_STEPS, eval_interval=0, checkpoint_interval=0
    )


def optuna_search(
    config: StudyConfig,
    prepared: Prepared,
    *,
    sampler: optuna.samplers.BaseSampler,
    storage: str,
    work: Path,
    seconds: float,
    mlflow_uri: str | None,
) -> None:
    """Plain Optuna: each trial trains `PEER_TRIAL_STEPS` steps with the project's trainer."""
    from trainers.loop.run import train

    def objective(trial: optuna.Trial) -> float:
        params = sample(trial, prepared.space)
        out = work / f"trial-{trial.number}"
        try:
            result = train(trial_spec(config, params, prepared, out))
        finally:
            shutil.rmtree(out, ignore_errors=True)
        if result.final_eval_loss is None:
            raise RuntimeError(f"trial {trial.number} ended without a validation loss")
        return float(result.final_eval_loss)

    callbacks = [_MlflowNames(mlflow_uri)] if mlflow_uri else []
    study = optuna.create_study(
        storage=storage, study_name="search", sampler=sampler, direction="minimize"
    )
    study.optimize(objective, timeout=seconds, callbacks=callbacks)


class _MlflowNames:
    """optuna-integration's `MLflowCallback`, with `@` in parameter names replaced by `:`.

    MLflow refuses `@` in a parameter name, and the space's per-profile parameters are
    named `micro_batch_size@fast` (`search_spaces.sampling.profile_param_name`).
    """

    def __init__(self, tracking_uri: str) -> None:
        import warnings

        from optuna_integration import MLflowCallback

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental
            self.callback = MLflowCallback(tracking_uri=tracking_uri, metric_name="val_loss")

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        renamed = copy.copy(trial)
        renamed.params = {k.replace("@", ":"): v for k, v in trial.params.items()}
        renamed.distributions = {k.replace("@", ":"): v for k, v in trial.distributions.items()}
        self.callback(study, renamed)


def hf_search(
    config: StudyConfig,
    prepared: Prepared,
    *,
    storage: str,
    work: Path,
    seconds: float,
) -> None:
    """`Trainer.hyperparameter_search(backend="optuna")` over the same space."""
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForSeq2Seq,
        Trainer,
        TrainingArguments,
    )

    tokenizer = AutoTokenizer.from_pretrained(prepared.model_path, local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    space = prepared.space
    train_sets = {
        length: _examples(config, prepared, length, tokenizer).train
        for length in sorted({p.length() for p in space.profiles.values()})
    }
    validation = _examples(config, prepared, prepared.eval_max_length, tokenizer).validation
    holder: dict[str, Any] = {}

    def model_init(trial: optuna.Trial | None) -> Any:
        # The Trainer calls model_init before hp_space; suggesting is idempotent per trial.
        params = sample(trial, space) if trial is not None else {"lora_r": 8, "lora_alpha": 16}
        model = AutoModelForCausalLM.from_pretrained(prepared.model_path, local_files_only=True)
        lora = LoraConfig(
            r=int(params["lora_r"]),
            lora_alpha=float(params["lora_alpha"]),  # type: ignore[arg-type]
            lora_dropout=float(params.get("lora_dropout", 0.0)),
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, lora)

    def hp_space(trial: optuna.Trial) -> dict[str, Any]:
        params = sample(trial, space)
        holder["trainer"].train_dataset = train_sets[int(params["max_length"])]
        return {
            "learning_rate": float(params["learning_rate"]),
            "per_device_train_batch_size": int(params["micro_batch_size"]),
            "gradient_accumulation_steps": int(params["gradient_accumulation_steps"]),
            "activation_checkpointing": bool(params["gradient_checkpointing"]),
        }

    args = TrainingArguments(
        output_dir=str(work / "hf"),
        max_steps=PEER_TRIAL_STEPS,
        per_device_eval_batch_size=HF_EVAL_BATCH,
        lr_scheduler_type="linear",
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=config.seed,
        use_cpu=config.device == "cpu",
        activation_checkpointing=False,
        activation_checkpointing_kwargs={"use_reentrant": False},
        remove_unused_columns=False,
    )
    trainer = Trainer(
        model_init=model_init,
        args=args,
        train_dataset=train_sets[min(train_sets)],
        eval_dataset=validation[: config.eval_samples],
        data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100),
    )
    holder["trainer"] = trainer
    trainer.hyperparameter_search(
        hp_space=hp_space,
        compute_objective=lambda metrics: float(metrics["eval_loss"]),
        n_trials=100_000,  # the timeout ends the search
        direction="minimize",
        backend="optuna",
        timeout=seconds,
        sampler=optuna.samplers.TPESampler(seed=config.seed),
        storage=storage,
        study_name="search",
    )


@dataclasses.dataclass
class _Split:
    train: list[dict[str, list[int]]]
    validation: list[dict[str, list[int]]]


def _examples(config: StudyConfig, prepared: Prepared, max_length: int, tokenizer: Any) -> _Split:
    """The bundled data tokenized at `max_length`, split as every run of the benchmark splits it."""
    from trainers.data.dataset import DataSpec, load_tokenized

    data = load_tokenized(
        DataSpec(
            path=prepared.data_path,
            max_length=max_length,
            validation_fraction=config.validation_fraction,
            seed=config.seed,
            cache_dir=str(WorkDir(config.work_dir).cache),
        ),
        tokenizer,
    )

    def rows(examples: Any) -> list[dict[str, list[int]]]:
        return [{"input_ids": e.input_ids, "labels": e.labels} for e in examples]

    return _Split(train=rows(data.train), validation=rows(data.validation))
