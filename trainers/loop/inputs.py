"""A run's inputs (tokenizer, tokenized data, base model + LoRA adapter), kept between runs.

A study's worker trains many short runs on one base model. `RunInputs` keeps what does not
change between them: the tokenizer, the tokenized data with its validation set, and the
base model itself, on its device and in its dtype. Each run attaches a fresh LoRA adapter
with its own rank, alpha, dropout and targets (PEFT's `get_peft_model`) and `release` takes
it off again (PEFT's `unload`, which puts the original modules back without merging), then
resets what a run may have changed on the base model: requires-grad flags, train/eval mode,
gradient checkpointing and its input hook, hooks, config values and compiled graphs. The
base weights are never written (they are frozen during the run), so they stay bit-identical.

A run that needs another base (another model or device) reloads it, and says so.
A run without a `RunInputs` of its own (the full run) gets a fresh one: the same code path,
so reuse changes nothing but time.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainers.data.dataset import TokenizedData, load_tokenized
from trainers.model.levers import LeverChoice, apply_levers, detect_levers, nothing_to_undo
from trainers.model.lora import ModelInfo, apply_lora, load_base_model, load_tokenizer
from trainers.model.quantization import load_quantized
from trainers.spec import TrainSpec

log = logging.getLogger(__name__)


@dataclass
class Attached:
    """One run's inputs: the shared tokenizer and data, the base model with its adapter."""

    tokenizer: Any
    data: TokenizedData
    model: Any  # the PEFT model: the shared base model with this run's adapter
    info: ModelInfo
    loaded_base: bool  # this run loaded the base model (False: kept from an earlier run)
    levers: LeverChoice = LeverChoice()


@dataclass(frozen=True)
class BaseKey:
    """What identifies a loaded base model: a run with another one reloads it."""

    path: str
    device: str  # the model is loaded in its checkpoint's dtype; autocast does the rest
    quantization: str = "none"  # a 4-bit base serves only 4-bit runs, and the reverse
    compute_precision: str = "fp32"  # what 4-bit layers compute in (16-bit bases: unused)
    levers: LeverChoice = LeverChoice()  # patched into the base at load (trainers.model.levers)


@dataclass
class BaseState:
    """The base model as loaded: what `release` puts back after a run."""

    training: dict[str, bool]
    requires_grad: dict[str, bool]
    hooks: dict[str, tuple[set[int], set[int], set[int]]]
    config: dict[str, Any]
    attributes: set[str]


@dataclass
class RunInputs:
    """Tokenizers, tokenized data and one base model, kept for the runs of one process.

    Attributes:
        keep_base: Keep the base model after a run (a study's worker). A one-off run
            (the full run) lets it go with the run.
        freeze_gc: After the first run, move what is alive into the garbage collector's
            permanent generation (`gc.freeze`): libraries, the base model and the data
            live as long as the worker, and the full collections that the Trainer,
            accelerate and Optuna run around every trial (~0.4 s each in a study's
            process, most of a tiny model's trial) no longer walk them.
    """

    keep_base: bool = True
    freeze_gc: bool = False
    loads: int = 0  # base model loads: 1 for a whole study unless a run needed another base
    _tokenizers: dict[str, Any] = field(default_factory=dict)
    _data: dict[tuple[Any, ...], TokenizedData] = field(default_factory=dict)
    _key: BaseKey | None = None
    _base: Any = None
    _state: BaseState | None = None
    _attached: Any = None
    _undo_levers: Callable[[], None] = field(default_factory=lambda: nothing_to_undo)
    _frozen: bool = False

    def attach(self, spec: TrainSpec, device: str, precision: str = "fp32") -> Attached:
        """The run's inputs: the shared base with a fresh adapter of `spec.lora`.

        The adapter's initial weights come from `spec.seed` (set just before), whatever
        ran in this process before.

        Raises:
            BadInputError: The model, data or LoRA targets are unusable.
            RuntimeError: The previous run's adapter is still attached.
        """
        from transformers import set_seed
        from transformers.utils import logging as hf_logging

        if self._attached is not None:
            raise RuntimeError("a run's adapter is still attached: release it first")
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # "Loading weights" bars
        tokenizer = self._tokenizer(spec.model)
        data = self._tokenized(spec, tokenizer)
        loads = self.loads
        key = BaseKey(
            path=str(Path(spec.model).resolve()),
            device=device,
            quantization=spec.quantization,
            compute_precision=precision if spec.quantization != "none" else "fp32",
            levers=detect_levers(spec, device),
        )
        base = self._base_model(spec.model, key)
        set_seed(spec.seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecations inside transformers/PEFT
            model, info = apply_lora(base, spec.lora)
        self._attached = model
        return Attached(
            tokenizer, data, model, info, loaded_base=self.loads > loads, levers=key.levers
        )

    def release(self, *, compiled: bool = False) -> None:
        """Take the run's adapter off and reset the base model to its loaded state.

        Args:
            compiled: The run used `torch.compile`: its graphs are dropped (they hold the
                adapter's modules, and a worker would otherwise reach dynamo's recompile
                limit after a few trials and silently fall back to eager mode).
        """
        model, self._attached = self._attached, None
        if model is None:
            return
        if compiled:
            import torch

            torch._dynamo.reset()
        if not self.keep_base:
            self._forget_base()
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            base = model.unload()
        _reset(base, self._state)
        del model
        if self.freeze_gc and not self._frozen:
            gc.collect()
            gc.freeze()
            self._frozen = True

    def _tokenizer(self, path: str) -> Any:
        key = str(Path(path).resolve())
        if key not in self._tokenizers:
            self._tokenizers[key] = load_tokenizer(path)
        return self._tokenizers[key]

    def _tokenized(self, spec: TrainSpec, tokenizer: Any) -> TokenizedData:
        """The run's tokenized data, validation at the study's one evaluation length."""
        data_spec = spec.data_spec()
        key = (data_spec, spec.eval_max_length, _file_version(data_spec.path))
        if key in self._data:
            return self._data[key]
        data = load_tokenized(data_spec, tokenizer)
        if spec.eval_max_length is not None and spec.eval_max_length != spec.max_length:
            # The same validation samples at one length for every run of a study: the split
            # depends on the records and the seed only, so it is the same at every length.
            at_eval_length = dataclasses.replace(data_spec, max_length=spec.eval_max_length)
            data = dataclasses.replace(
                data, validation=load_tokenized(at_eval_length, tokenizer).validation
            )
        self._data = {k: v for k, v in self._data.items() if k[2] == key[2]}  # data changed
        self._data[key] = data
        return data

    def _base_model(self, path: str, key: BaseKey) -> Any:
        if self._base is not None and key == self._key:
            return self._base
        if self._base is not None and self._key is not None:
            log.info("trial engine: reloading the base model (%s)", _difference(self._key, key))
            self._forget_base()
        if key.quantization == "nf4":
            self._base = load_quantized(path, device=key.device, precision=key.compute_precision)
        else:
            self._base = load_base_model(path)
        self._undo_levers = apply_levers(self._base, key.levers)
        self._state = _snapshot(self._base)
        self._key = key
        self.loads += 1
        return self._base

    def _forget_base(self) -> None:
        self._base = self._state = self._key = None
        self._undo_levers()
        self._undo_levers = nothing_to_undo
        if self._frozen:
            gc.unfreeze()  # the old model was frozen with the rest: let it be collected
            self._frozen = False
        gc.collect()


def _file_version(path: str) -> tuple[int, int]:
    """The data file's size and modification time: a changed file is read again."""
    try:
        stat = Path(path).stat()
    except OSError:
        return (-1, -1)  # load_tokenized says what is wrong with it
    return (stat.st_size, stat.st_mtime_ns)


def _difference(old: BaseKey, new: BaseKey) -> str:
    changed = [
        f"{name} {getattr(old, name)} -> {getattr(new, name)}"
        for name in ("path", "device", "quantization", "compute_precision", "levers")
        if getattr(old, name) != getattr(new, name)
    ]
    return ", ".join(changed)


def _hook_ids(module: Any) -> tuple[set[int], set[int], set[int]]:
    return (
        set(module._forward_hooks),
        set(module._forward_pre_hooks),
        set(module._backward_hooks),
    )


def _snapshot(base: Any) -> BaseState:
    return BaseState(
        training={name: m.training for name, m in base.named_modules()},
        requires_grad={name: p.requires_grad for name, p in base.named_parameters()},
        hooks={name: _hook_ids(m) for name, m in base.named_modules()},
        config=base.config.to_dict(),
        attributes=set(vars(base)),
    )


def _reset(base: Any, state: BaseState | None) -> None:
    """Put back what a run changed on the base model (never its weights: they were frozen)."""
    if state is None:
        return
    if hasattr(base, "is_activation_checkpointing"):  # its name since transformers 5.x
        if base.is_activation_checkpointing:
            base.activation_checkpointing_disable()
    elif getattr(base, "is_gradient_checkpointing", False):
        base.gradient_checkpointing_disable()
    if getattr(base, "_require_grads_hook", None) is not None:
        base.disable_input_require_grads()  # the Trainer's hook for checkpointing + adapters
    for name, module in base.named_modules():
        module.training = state.training.get(name, module.training)
        kept = state.hooks.get(name, (set(), set(), set()))
        for hooks, before in zip(
            (module._forward_hooks, module._forward_pre_hooks, module._backward_hooks),
            kept,
            strict=True,
        ):
            for hook_id in [h for h in hooks if h not in before]:
                del hooks[hook_id]
    for name, parameter in base.named_parameters():
        parameter.requires_grad_(state.requires_grad.get(name, parameter.requires_grad))
        parameter.grad = None
    now = base.config.to_dict()
    for name, value in state.config.items():
        if now.get(name) != value and not isinstance(value, dict):
            setattr(base.config, name, value)  # e.g. use_cache, turned off for checkpointing
    for name in set(vars(base)) - state.attributes:
        if name.startswith("_hf_peft") or name == "peft_config":
            delattr(base, name)
