"""Speed levers of a training run: which are on, decided by a pure function, and applied.

Two levers, each off unless asked for until a GPU lease (`benchmarks/gpu_lease.py`, part
`levers`) measures it faster at equal loss on CUDA; a lever so measured is added to
`MEASURED_FASTER` and "auto" turns it on there.

* `sdpa_fast_path`: a sliding-window model (Mistral) whose rows fit inside its window
  attends exactly as a plain causal model, but transformers still builds an explicit
  sliding-window mask once a row is as long as the window, and SDPA given an explicit
  mask leaves its flash kernel. Dropping the window from the config when the rows fit
  lets transformers skip the mask (`is_causal`); the arithmetic is the same function
  (a query at i sees keys j with i - j < window: every j <= i when rows are no longer
  than the window). Padding-free rows keep their block-diagonal mask: not applied.
* `liger`: Liger kernels (`liger-kernel`: fused linear cross-entropy, RMSNorm, SwiGLU,
  RoPE; Triton, CUDA only) patched into the base model before the adapters go on. The
  fused loss never materialises the logits, which the time model's memory then leaves out.

`choose_levers` takes only what was detected, so its CUDA branches are tested on a CPU
(as `trainers.model.runtime.choose_runtime`).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.errors import BadInputError
from trainers.spec import LEVER_MODES

LEVERS = ("liger", "sdpa_fast_path")
# Levers a lease measured faster at equal loss on CUDA (none yet: no lease has run them).
MEASURED_FASTER: frozenset[str] = frozenset()
# model_type values liger-kernel 0.8 patches through `_apply_liger_kernel_to_instance`.
LIGER_MODEL_TYPES = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "granite"}
)


@dataclass(frozen=True)
class LeverChoice:
    """The levers a run uses, and why."""

    liger: bool = False
    sdpa_fast_path: bool = False
    reason: str = "no speed levers"

    @property
    def names(self) -> tuple[str, ...]:
        """The levers that are on, in `LEVERS` order."""
        return tuple(name for name in LEVERS if getattr(self, name))


def choose_levers(
    *,
    liger: str,
    sdpa_fast_path: str,
    device: str,
    model_type: str,
    sliding_window: int | None,
    row_length: int,
    packing: str,
    liger_installed: bool,
    measured_faster: frozenset[str] = MEASURED_FASTER,
) -> LeverChoice:
    """Decide the levers of a run from what was asked and what was detected.

    Args:
        liger: "auto", "on" or "off" (`TrainSpec.liger`).
        sdpa_fast_path: "auto", "on" or "off" (`TrainSpec.sdpa_fast_path`).
        device: The run's resolved device.
        model_type: The model config's `model_type`.
        sliding_window: The config's sliding window (None: none).
        row_length: The longest row a micro-batch holds (max_length).
        packing: "none" or "padding_free".
        liger_installed: Whether `liger_kernel` can be imported.
        measured_faster: Levers "auto" turns on on CUDA.

    Raises:
        BadInputError: "on" for Liger where it cannot run.
    """
    for name, mode in (("liger", liger), ("sdpa_fast_path", sdpa_fast_path)):
        if mode not in LEVER_MODES:
            raise BadInputError(f"{name} must be one of {', '.join(LEVER_MODES)}, but got {mode!r}")
    reasons: list[str] = []
    cuda = device == "cuda"
    use_liger = False
    if liger == "on":
        if not cuda:
            raise BadInputError(f"liger=on needs a CUDA device (Triton kernels), not {device}")
        if not liger_installed:
            raise BadInputError("liger=on needs liger-kernel: pip install liger-kernel")
        if model_type not in LIGER_MODEL_TYPES:
            raise BadInputError(f"liger=on: liger-kernel does not patch model_type {model_type!r}")
        use_liger = True
    elif liger == "auto":
        use_liger = (cuda and liger_installed and model_type in LIGER_MODEL_TYPES
                     and "liger" in measured_faster)  # fmt: skip
    if use_liger:
        reasons.append("Liger kernels")

    fits = sliding_window is not None and row_length <= sliding_window
    use_fast_path = False
    if sdpa_fast_path != "off" and fits and packing != "padding_free":
        use_fast_path = sdpa_fast_path == "on" or (cuda and "sdpa_fast_path" in measured_faster)
    if use_fast_path:
        reasons.append(f"rows of {row_length} inside the sliding window of {sliding_window}: "
                       "plain causal attention (SDPA is_causal)")  # fmt: skip
    return LeverChoice(
        liger=use_liger,
        sdpa_fast_path=use_fast_path,
        reason="; ".join(reasons) if reasons else "no speed levers",
    )


def requested_levers(
    liger: str,
    sdpa_fast_path: str,
    device_kind: str,
    measured_faster: frozenset[str] = MEASURED_FASTER,
) -> tuple[str, ...]:
    """The levers a plan counts before the model is at hand (`analysis.planning.fits`).

    What `choose_levers` turns on where the model allows it: "on" (Liger only on CUDA), or
    "auto" for a lever measured faster, on CUDA. A model the fast path does not apply to
    runs without it; its step factor (`analysis.timemodel.workload.LEVER_STEP_FACTOR`) is 1 until a
    lease measures it, so the plan is the same either way.
    """
    cuda = device_kind == "cuda"
    wanted = []
    for name, mode in (("liger", liger), ("sdpa_fast_path", sdpa_fast_path)):
        on = mode == "on" or (mode == "auto" and cuda and name in measured_faster)
        if on and (cuda or name != "liger"):
            wanted.append(name)
    return tuple(wanted)


def detect_levers(spec: Any, device: str) -> LeverChoice:
    """`choose_levers` for `spec` (a `TrainSpec`) with its model's config read from disk."""
    import json
    from pathlib import Path

    config_file = Path(spec.model) / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    return choose_levers(
        liger=spec.liger,
        sdpa_fast_path=spec.sdpa_fast_path,
        device=device,
        model_type=str(config.get("model_type", "")),
        sliding_window=config.get("sliding_window"),
        row_length=spec.max_length,
        packing=spec.packing,
        liger_installed=importlib.util.find_spec("liger_kernel") is not None,
    )


def apply_levers(model: Any, choice: LeverChoice) -> Callable[[], None]:
    """Apply `choice` to a freshly loaded base model (before the adapters go on).

    Returns:
        What undoes the levers beyond `model`: call it once the model is let go.
    """
    if choice.sdpa_fast_path:
        model.config.sliding_window = None
        text = getattr(model.config, "text_config", None)
        if text is not None and hasattr(text, "sliding_window"):
            text.sliding_window = None
    if not choice.liger:
        return nothing_to_undo
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    # Given an instance, liger-kernel 0.8 still rebinds its model type's modeling module
    # (`apply_rotary_pos_emb`, the RMSNorm and MLP classes): every later model of that type
    # in the process would be built with Liger's modules and RoPE (a study worker's run with
    # the lever off, the lease's run without it). The instance's RoPE is that module global,
    # so the module is put back when the model is let go, not at once.
    saved = modeling_globals()
    _apply_liger_kernel_to_instance(model=model)
    return functools.partial(restore_globals, saved)


def nothing_to_undo() -> None:
    return None


def modeling_globals() -> dict[str, dict[str, Any]]:
    """The names bound in every transformers modeling module imported so far."""
    return {
        name: dict(vars(module))
        for name, module in list(sys.modules.items())
        if name.startswith("transformers.models.") and module is not None
    }


def restore_globals(saved: dict[str, dict[str, Any]]) -> None:
    """Bind again what `modeling_globals` saw (names bound since are left alone)."""
    for name, names in saved.items():
        module = sys.modules.get(name)
        if module is None:
            continue
        for key, value in names.items():
            if getattr(module, key, None) is not value:
                setattr(module, key, value)
