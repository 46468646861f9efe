"""Tiny causal language models built locally, for tests, demos and calibration runs.

There is no model hub here, so the project makes its own: a byte-level BPE tokenizer trained
on the bundled demo data and a randomly initialised (seeded) decoder of one of the families
people fine-tune. Each family keeps the shape ratios of a published model (`FAMILIES`): MLP
width over hidden size, grouped-query attention as far as four heads allow, Mistral's sliding
window, Phi-3's fused projections, Gemma's multi-query attention and Mixtral's experts. Both
are saved with ``save_pretrained`` so that ``AutoModelForCausalLM.from_pretrained(dir)`` and
``AutoTokenizer.from_pretrained(dir)`` load them like any hub model.

Command line::

    python -m trainers.tiny --out DIR [--arch llama|mistral|qwen2|phi3|gemma|mixtral|gpt_neox|gpt2]
        [--size xs|s|m] [--seed N] [--pretrain-steps N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import BadInputError
from common.files import replace_folder
from trainers.data.paths import cache_root, demo_data_path

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase, PreTrainedTokenizerFast

TOKENIZER_VOCAB_SIZE = 1000
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# The template trainers.data.dataset falls back to, written out so the tiny tokenizer has a real one.
# transformers renders templates with trim_blocks, which eats a newline written right after a
# block tag, hence the explicit "\n" expressions.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
RECIPE_FILE = "hpo_tiny.json"
RECIPE_VERSION = 3
PRETRAIN_LENGTH = 64  # tokens per pre-training sample
PRETRAIN_BATCH = 16
PRETRAIN_LR = 3e-3
"""Bump when a build changes (tokenizer, dimensions, init) so cached tiny models get rebuilt."""


@dataclass(frozen=True)
class TinySize:
    """Dimensions of one tiny model size (the MLP width comes from the family's ratio)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    max_positions: int = 512


SIZES: dict[str, TinySize] = {
    "xs": TinySize(hidden_size=64, num_layers=2, num_heads=4),
    "s": TinySize(hidden_size=128, num_layers=4, num_heads=4),
    # ~100 M parameters (llama: 98.9 M): big enough that loading it costs what it costs,
    # for the trial-overhead benchmark.
    "m": TinySize(hidden_size=768, num_layers=16, num_heads=12),
}


@dataclass(frozen=True)
class Family:
    """The shape ratios a tiny model keeps from the published model it stands for.

    Attributes:
        source: The published model whose ``config.json`` the ratios come from.
        mlp_ratio: intermediate_size / hidden_size (per expert for a mixture of experts).
        query_groups: Query heads per key/value head (grouped-query attention); the tiny
            model has ``num_heads`` heads, so at most that many share one key/value head.
        experts: Experts per layer (0: a dense MLP); ``experts_per_token`` of them run.
        experts_per_token: Experts routed to per token.
        sliding_window: Attention window as a share of the context (0: full attention).
    """

    source: str
    mlp_ratio: float
    query_groups: int = 1
    experts: int = 0
    experts_per_token: int = 0
    sliding_window: float = 0.0


FAMILIES: dict[str, Family] = {
    # TinyLlama-1.1B: hidden 2048, intermediate 5632, 32 heads over 4 key/value heads.
    "llama": Family("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", 2.75, 8),
    # Mistral-7B-v0.1: hidden 4096, intermediate 14336, 32 over 8 heads, a 4096-token window
    # of a 32768-token context.
    "mistral": Family("mistralai/Mistral-7B-v0.1", 3.5, 4, sliding_window=0.125),
    # Qwen2.5-7B: hidden 3584, intermediate 18944, 28 over 4 heads, biased q/k/v.
    "qwen2": Family("Qwen/Qwen2.5-7B", 18944 / 3584, 7),
    # Phi-3-mini-4k: hidden 3072, intermediate 8192, 32 heads each with its own key/value
    # head; q/k/v fused into qkv_proj, gate and up into gate_up_proj.
    "phi3": Family("microsoft/Phi-3-mini-4k-instruct", 8192 / 3072, 1),
    # Gemma-2B: hidden 2048, intermediate 16384, 8 query heads over one key/value head.
    "gemma": Family("google/gemma-2b", 8.0, 8),
    # Mixtral-8x7B: 8 experts of intermediate 14336 (hidden 4096), 2 per token, 32 over 8
    # heads. The tiny one has 4 experts (2 per token) to stay small.
    "mixtral": Family("mistralai/Mixtral-8x7B-v0.1", 3.5, 4, experts=4, experts_per_token=2),
    # GPT-NeoX (Pythia) and GPT-2: 4x MLP, multi-head attention.
    "gpt_neox": Family("EleutherAI/pythia-160m", 4.0),
    "gpt2": Family("openai-community/gpt2", 4.0),
}
ARCHS = tuple(FAMILIES)


def _check_choice(arch: str, size: str) -> None:
    if arch not in ARCHS:
        raise BadInputError(f"arch must be one of {list(ARCHS)}, but got {arch=}")
    if size not in SIZES:
        raise BadInputError(f"size must be one of {list(SIZES)}, but got {size=}")


def _demo_texts() -> Iterator[str]:
    """Every string in the three demo files, the tokenizer's training corpus."""
    for shape in ("text", "prompt_completion", "messages"):
        with demo_data_path(shape).open(encoding="utf-8") as lines:
            for line in lines:
                record = json.loads(line)
                if "text" in record:
                    yield record["text"]
                elif "prompt" in record:
                    yield record["prompt"] + record["completion"]
                else:
                    yield from (message["content"] for message in record["messages"])


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train the tiny byte-level BPE tokenizer on the demo data.

    Training is deterministic. The demo data is small, so the BPE trainer runs out of merges
    a little below ``TOKENIZER_VOCAB_SIZE`` (about 700 tokens); byte-level fallback still
    encodes any text.

    Returns:
        A fast tokenizer with ``<|endoftext|>`` as bos/eos, ``<|pad|>`` as pad, the role markers
        as extra special tokens and a chat template.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=[EOS_TOKEN, PAD_TOKEN, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_demo_texts(), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        extra_special_tokens=list(ROLE_TOKENS),
        model_max_length=SIZES["xs"].max_positions,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_config(arch: str, size: str, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """The transformers config of one tiny architecture and size (no dropout, tied embeddings).

    Args:
        arch: One of ``ARCHS``.
        size: One of ``SIZES``.
        tokenizer: Supplies the vocabulary size and the special token ids.

    Returns:
        The config, ready for ``AutoModelForCausalLM.from_config``.
    """
    from transformers import AutoConfig

    _check_choice(arch, size)
    dims, family = SIZES[size], FAMILIES[arch]
    # A multiple of 8, as the published widths are.
    intermediate = 8 * round(dims.hidden_size * family.mlp_ratio / 8)
    common = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": True,
        # The usual 0.02 suits widths in the thousands. At width 64 it bounds the logits to
        # about +-1 through the frozen tied embeddings, and LoRA cannot lower the loss.
        "initializer_range": dims.hidden_size**-0.5,
    }
    if arch == "gpt2":
        return AutoConfig.for_model(
            "gpt2",
            n_embd=dims.hidden_size,
            n_layer=dims.num_layers,
            n_head=dims.num_heads,
            n_inner=intermediate,
            n_positions=dims.max_positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
    shared: dict[str, Any] = {
        "hidden_size": dims.hidden_size,
        "num_hidden_layers": dims.num_layers,
        "num_attention_heads": dims.num_heads,
        "intermediate_size": intermediate,
        "max_position_embeddings": dims.max_positions,
        **common,
    }
    if arch != "gpt_neox":
        shared["num_key_value_heads"] = max(dims.num_heads // family.query_groups, 1)
        shared["head_dim"] = dims.hidden_size // dims.num_heads
    if family.sliding_window:
        shared["sliding_window"] = int(dims.max_positions * family.sliding_window)
    if family.experts:
        shared["num_local_experts"] = family.experts
        shared["num_experts_per_tok"] = family.experts_per_token
    return AutoConfig.for_model(arch, **shared)


def build_tiny(
    out_dir: str | Path,
    *,
    arch: str = "llama",
    size: str = "xs",
    seed: int = 0,
    pretrain_steps: int = 0,
) -> Path:
    """Build a tiny model and its tokenizer and save both into ``out_dir``.

    Args:
        out_dir: Folder to write (created if missing; files in it are overwritten).
        arch: One of ``ARCHS`` (``FAMILIES`` gives each one's published model).
        size: ``"xs"`` (hidden 64, 2 layers) or ``"s"`` (hidden 128, 4 layers).
        seed: Seed of the random weight initialisation.
        pretrain_steps: Full-parameter training steps on the bundled text data after the
            random initialisation, so that LoRA later adapts a model that already knows the
            language, as it does in real use (0: random weights).

    Returns:
        The folder, loadable with ``from_pretrained``.

    Raises:
        BadInputError: Unknown ``arch`` or ``size``.
    """
    _check_choice(arch, size)
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = build_tokenizer()
    config = build_config(arch, size, tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if pretrain_steps:
        pretrain(model, tokenizer, steps=pretrain_steps, seed=seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    recipe = {
        "recipe_version": RECIPE_VERSION,
        "arch": arch,
        "size": size,
        "seed": seed,
        "pretrain_steps": pretrain_steps,
    }
    (out / RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n", encoding="utf-8")
    return out


def pretrain(
    model: Any, tokenizer: PreTrainedTokenizerBase, *, steps: int, seed: int = 0
) -> list[float]:
    """Train every weight of `model` on the bundled text data for `steps` AdamW steps.

    Returns:
        The training loss of every step (it falls: the model learns the demo language).
    """
    import torch

    texts = [json.loads(line)["text"] for line in demo_data_path("text").open(encoding="utf-8")]
    ids = [tokenizer(t + EOS_TOKEN)["input_ids"][:PRETRAIN_LENGTH] for t in texts]
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR, weight_decay=0.0)
    pad = int(tokenizer.pad_token_id)
    losses = []
    model.train()
    for _ in range(steps):
        rows = [ids[i] for i in torch.randint(len(ids), (PRETRAIN_BATCH,), generator=generator)]
        width = max(len(r) for r in rows)
        batch = torch.full((len(rows), width), pad, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        for n, row in enumerate(rows):
            batch[n, : len(row)] = torch.tensor(row)
            labels[n, : len(row)] = torch.tensor(row)
        loss = model(input_ids=batch, attention_mask=(labels != -100).long(), labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def is_complete(model_dir: Path) -> bool:
    """Whether ``model_dir`` holds every file a tiny model build writes, from this recipe."""
    if not all((model_dir / name).is_file() for name in _REQUIRED_FILES):
        return False
    try:
        recipe = json.loads((model_dir / RECIPE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(recipe, dict) and recipe.get("recipe_version") == RECIPE_VERSION


def default_tiny_model(
    root: Path | None = None, arch: str = "llama", size: str = "xs", *, pretrain_steps: int = 0
) -> Path:
    """Path of a cached tiny model, built on first use.

    The build goes to a temporary folder next to the target and is renamed into place, so a
    reader never sees half a model; a folder missing files or built by an older recipe
    (``RECIPE_VERSION``) is rebuilt.

    Args:
        root: Cache folder; default ``<cache root>/models`` (``$HPO_CACHE_DIR`` or
            ``~/.cache/hpo``).
        arch: Architecture, as for ``build_tiny``.
        size: Size, as for ``build_tiny``.
        pretrain_steps: As for ``build_tiny``; a pre-trained model is cached on its own.

    Returns:
        ``<root>/<arch>-<size>`` (``-pretrained<steps>`` appended when pre-trained).
    """
    _check_choice(arch, size)
    base = Path(root) if root is not None else cache_root() / "models"
    suffix = f"-pretrained{pretrain_steps}" if pretrain_steps else ""
    target = base / f"{arch}-{size}{suffix}"
    if is_complete(target):
        return target
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=base))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; the model is not
        build_tiny(staging, arch=arch, size=size, pretrain_steps=pretrain_steps)
        # Another process may finish the same build first; theirs is as good as ours.
        try:
            if not is_complete(target):  # missing, incomplete, or built by an older recipe
                replace_folder(staging, target)
        except OSError:
            if not is_complete(target):
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m trainers.tiny",
        description="Build a tiny random-init causal LM and its tokenizer into a folder.",
    )
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--arch", default="llama", help=f"one of {', '.join(ARCHS)}")
    parser.add_argument("--size", default="xs", help=f"one of {', '.join(SIZES)}")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    parser.add_argument(
        "--pretrain-steps",
        type=int,
        default=0,
        help="full-parameter steps on the bundled text data after initialisation (0: none)",
    )
    args = parser.parse_args(argv)
    try:
        _check_choice(args.arch, args.size)
    except BadInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar for writing one 0.7 MB file is only noise here
    if args.pretrain_steps < 0:
        print(
            f"error: --pretrain-steps must be >= 0, but got {args.pretrain_steps}", file=sys.stderr
        )
        return 2
    out = build_tiny(
        args.out,
        arch=args.arch,
        size=args.size,
        seed=args.seed,
        pretrain_steps=args.pretrain_steps,
    )
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
