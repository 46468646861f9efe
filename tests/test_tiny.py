"""Tiny models: every architecture round-trips through from_pretrained and runs forward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.errors import BadInputError
from tests.cli import run_module
from trainers.data.paths import demo_data_path
from trainers.tiny import (
    ARCHS,
    RECIPE_FILE,
    RECIPE_VERSION,
    build_tiny,
    default_tiny_model,
    is_complete,
    main,
)

MODEL_CLASSES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}


@pytest.mark.parametrize("arch", ARCHS)
def test_round_trip_and_forward(arch: str, tmp_path: Path) -> None:
    out = build_tiny(tmp_path / arch, arch=arch)
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == MODEL_CLASSES[arch]
    assert model.config.vocab_size == len(tokenizer)
    assert model.dtype == torch.float32
    assert 100_000 < model.num_parameters() < 500_000  # the mixture of experts is the largest

    batch = tokenizer(
        ["Bolan lives in Tavel.", "3 plus 4 is 7."], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (2, batch["input_ids"].shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


def test_tokenizer_specials_and_chat_template(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer.pad_token == "<|pad|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert 500 < len(tokenizer) <= 1000
    messages = [{"role": "user", "content": "3 + 4 ="}, {"role": "assistant", "content": "7"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered == "<|user|>\n3 + 4 =\n<|assistant|>\n7<|endoftext|>\n"
    # Byte-level BPE encodes any text, even what the demo data never shows.
    text = "Ünïcode ✓ and tabs\t!"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_same_seed_same_weights(tmp_path: Path) -> None:
    def weights(seed: int) -> dict[str, torch.Tensor]:
        out = build_tiny(tmp_path / f"seed{seed}-{len(list(tmp_path.iterdir()))}", seed=seed)
        return AutoModelForCausalLM.from_pretrained(out).state_dict()

    first, again, other = weights(0), weights(0), weights(1)
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_size_s(tmp_path: Path) -> None:
    config = AutoModelForCausalLM.from_pretrained(build_tiny(tmp_path, size="s")).config
    # TinyLlama's MLP ratio (5632 / 2048 = 2.75) and 8 query heads per key/value head.
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (128, 4, 352)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 1)


def test_default_tiny_model_builds_once_and_repairs(tmp_path: Path) -> None:
    path = default_tiny_model(tmp_path, arch="gpt2")
    assert path == tmp_path / "gpt2-xs" and is_complete(path)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert default_tiny_model(tmp_path, arch="gpt2") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2-xs"]  # no staging folder left

    (path / "model.safetensors").unlink()
    assert default_tiny_model(tmp_path, arch="gpt2") == path
    assert is_complete(path)

    recipe = path / RECIPE_FILE
    recipe.write_text(recipe.read_text().replace(f": {RECIPE_VERSION},", ": 0,"))
    assert not is_complete(path)
    default_tiny_model(tmp_path, arch="gpt2")
    assert json.loads(recipe.read_text())["recipe_version"] == RECIPE_VERSION


@pytest.mark.parametrize(("arch", "size"), [("bert", "xs"), ("llama", "xl")])
def test_bad_choice_is_bad_input(arch: str, size: str, tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="but got"):
        build_tiny(tmp_path, arch=arch, size=size)
    with pytest.raises(BadInputError):
        default_tiny_model(tmp_path, arch=arch, size=size)
    assert not list(tmp_path.iterdir())


def test_cli_bad_arch_exits_2(tmp_path: Path) -> None:
    proc = run_module("trainers.tiny", "--out", str(tmp_path / "m"), "--arch", "bert")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "arch='bert'" in proc.stderr
    assert not (tmp_path / "m").exists()


def test_cli_builds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(tmp_path / "m"), "--arch", "qwen2", "--seed", "3"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")
    assert is_complete(tmp_path / "m")


def test_pretrained_tiny_model_knows_the_demo_language(tmp_path: Path) -> None:
    """`--pretrain-steps`: LoRA then adapts a model that already knows the language."""
    random_init = default_tiny_model(tmp_path)
    pretrained = default_tiny_model(tmp_path, pretrain_steps=60)
    assert pretrained != random_init and pretrained.name == "llama-xs-pretrained60"
    assert json.loads((pretrained / RECIPE_FILE).read_text())["pretrain_steps"] == 60
    assert default_tiny_model(tmp_path, pretrain_steps=60) == pretrained  # cached

    tokenizer = AutoTokenizer.from_pretrained(pretrained)
    text = json.loads(demo_data_path("text").open().readline())["text"]
    batch = tokenizer(text, return_tensors="pt")

    def loss(folder: Path) -> float:
        model = AutoModelForCausalLM.from_pretrained(folder)
        with torch.no_grad():
            return float(model(**batch, labels=batch["input_ids"]).loss)

    assert loss(pretrained) < 0.6 * loss(random_init)


def test_cli_rejects_negative_pretrain_steps(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path / "m"), "--pretrain-steps", "-1"]) == 2
    assert not (tmp_path / "m").exists()
