"""Speed levers: the pure decision (CUDA branches on a CPU), and the SDPA fast path trained
for real on a tiny Mistral: the same losses, with plain causal attention instead of a mask."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch

from common.errors import BadInputError
from tests.configs import demo_spec
from trainers.model.levers import LeverChoice, apply_levers, choose_levers

BASE = dict(liger="auto", sdpa_fast_path="auto", device="cuda", model_type="mistral",
            sliding_window=4096, row_length=4096, packing="none", liger_installed=True)  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "measured", "expected"),
    [
        ({}, frozenset(), ()),  # nothing measured yet: auto is off
        ({}, frozenset({"liger", "sdpa_fast_path"}), ("liger", "sdpa_fast_path")),
        ({"device": "cpu"}, frozenset({"liger", "sdpa_fast_path"}), ()),
        ({"liger_installed": False}, frozenset({"liger"}), ()),
        ({"model_type": "gpt2"}, frozenset({"liger"}), ()),
        ({"sdpa_fast_path": "on"}, frozenset(), ("sdpa_fast_path",)),
        ({"sdpa_fast_path": "on", "device": "cpu"}, frozenset(), ("sdpa_fast_path",)),
        ({"sdpa_fast_path": "on", "row_length": 4097}, frozenset(), ()),  # the window matters
        ({"sdpa_fast_path": "on", "sliding_window": None}, frozenset(), ()),  # no window
        ({"sdpa_fast_path": "on", "packing": "padding_free"}, frozenset(), ()),  # needs its mask
        ({"sdpa_fast_path": "off"}, frozenset({"sdpa_fast_path"}), ()),
        ({"liger": "on"}, frozenset(), ("liger",)),
        ({"liger": "off"}, frozenset({"liger"}), ()),
    ],
)
def test_choose_levers(changes: dict, measured: frozenset[str], expected: tuple) -> None:
    choice = choose_levers(**{**BASE, **changes}, measured_faster=measured)
    assert choice.names == expected
    assert (choice.reason == "no speed levers") == (not expected)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"liger": "on", "device": "cpu"}, "needs a CUDA device"),
        ({"liger": "on", "liger_installed": False}, "pip install liger-kernel"),
        ({"liger": "on", "model_type": "gpt2"}, "gpt2"),
        ({"liger": "yes"}, "liger must be one of auto, on, off"),
    ],
)
def test_impossible_levers_are_bad_input(changes: dict, message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        choose_levers(**{**BASE, **changes})


def test_nothing_is_on_by_default() -> None:
    from trainers.model.levers import MEASURED_FASTER

    assert LeverChoice().names == ()
    # A lever joins MEASURED_FASTER only with a lease's measurement (docs/benchmarks/gpu_lease.md).
    assert MEASURED_FASTER == frozenset()


def test_sdpa_fast_path_trains_the_same_run_without_a_mask(tmp_path: Path, monkeypatch) -> None:
    import torch.nn.functional as F
    import transformers.integrations.sdpa_attention as sdpa

    from trainers.loop.run import train
    from trainers.tiny import build_tiny

    model = build_tiny(tmp_path / "mistral", arch="mistral", size="xs")
    window = json.loads((model / "config.json").read_text())["sliding_window"]
    masks: list[bool] = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        masks.append(kwargs.get("attn_mask") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(sdpa.torch.nn.functional, "scaled_dot_product_attention", spy)
    results = {}
    for mode in ("off", "on"):
        masks.clear()
        spec = demo_spec(model, tmp_path / mode, max_length=window, overflow="pack",
                         micro_batch_size=2, max_steps=3, eval_interval=0, eval_samples=4,
                         sdpa_fast_path=mode,
                         device="cpu")  # fmt: skip
        results[mode] = (train(spec), any(masks))
    off, on = results["off"][0], results["on"][0]
    assert off.levers == [] and on.levers == ["sdpa_fast_path"]
    # Rows as long as the window: transformers masks them explicitly unless the lever is on.
    assert results["off"][1] and not results["on"][1]
    assert [loss for _, loss in on.train_losses] == pytest.approx(
        [loss for _, loss in off.train_losses], rel=1e-5
    )


@pytest.mark.parametrize(
    ("liger", "fast", "device", "measured", "expected"),
    [
        ("auto", "auto", "cuda", frozenset(), ()),
        ("auto", "auto", "cuda", frozenset({"liger"}), ("liger",)),
        ("auto", "auto", "cpu", frozenset({"liger", "sdpa_fast_path"}), ()),
        ("on", "on", "cuda", frozenset(), ("liger", "sdpa_fast_path")),
        ("on", "on", "cpu", frozenset(), ("sdpa_fast_path",)),  # Liger cannot run there
    ],
)
def test_the_plan_counts_the_levers_a_run_asks_for(
    liger: str, fast: str, device: str, measured: frozenset[str], expected: tuple
) -> None:
    from trainers.model.levers import requested_levers

    assert requested_levers(liger, fast, device, measured) == expected


def test_the_time_model_drops_the_logits_under_liger_and_keeps_the_step_time() -> None:
    import dataclasses

    from analysis.planning.fits import plan_of_spec
    from analysis.timemodel.hardware import prior_coefficients
    from analysis.timemodel.machine import this_machine
    from analysis.timemodel.model import ModelProfile, memory_breakdown, predict
    from trainers.spec import TrainSpec

    model = ModelProfile(total_parameters=7_000_000_000, n_layers=32, hidden_size=4096,
                         vocab_size=32_000, lora_parameters_per_rank=1_300_000)  # fmt: skip
    hardware = dataclasses.replace(this_machine("cpu", "fp32"), device_kind="cuda",
                                   precision="bf16")  # fmt: skip
    spec = TrainSpec(model="m", data="d.jsonl", micro_batch_size=2, max_length=2048,
                     liger="on", max_steps=10)  # fmt: skip
    with_liger = plan_of_spec(spec, model, [2048] * 64, n_validation=8, hardware=hardware)
    without = dataclasses.replace(with_liger, levers=())
    assert with_liger.levers == ("liger",)
    c = prior_coefficients(hardware)
    logits = 2 * 4.0 * 2 * 2048 * 32_000 * c.activation_memory_scale  # fp32 + gradient
    drop = (sum(memory_breakdown(without, c).values())
            - sum(memory_breakdown(with_liger, c).values()))  # fmt: skip
    assert drop == pytest.approx(logits, rel=1e-9)
    # No measured speed-up yet: the same duration either way.
    assert predict(with_liger, c).seconds_p50 == pytest.approx(predict(without, c).seconds_p50)


def test_what_a_lever_rebinds_in_a_modeling_module_is_bound_again_when_undone() -> None:
    from transformers.models.llama import modeling_llama as llama

    from trainers.model.levers import modeling_globals, restore_globals

    original = (llama.apply_rotary_pos_emb, llama.LlamaRMSNorm, llama.LlamaMLP)
    saved = modeling_globals()
    try:
        # What liger-kernel 0.8 does to the module when given a Llama instance: later Llama
        # models (a run with the lever off) would be built with its classes and RoPE.
        llama.apply_rotary_pos_emb = lambda *args, **kwargs: args
        llama.LlamaRMSNorm = type("LigerRMSNorm", (torch.nn.Module,), {})
        llama.LlamaMLP = type("LigerSwiGLUMLP", (torch.nn.Module,), {})
        restore_globals(saved)
        assert (llama.apply_rotary_pos_emb, llama.LlamaRMSNorm, llama.LlamaMLP) == original
    finally:
        llama.apply_rotary_pos_emb, llama.LlamaRMSNorm, llama.LlamaMLP = original
    # A lever that rebinds nothing has nothing to undo.
    choice = LeverChoice(liger=False, sdpa_fast_path=False, reason="off")
    model = types.SimpleNamespace(config=types.SimpleNamespace(sliding_window=4096))
    apply_levers(model, choice)()
    assert model.config.sliding_window == 4096
