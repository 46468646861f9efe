"""Tiny causal language models built locally, for tests, demos and calibration runs.

There is no model hub here, so the project makes its own: a byte-level BPE tokenizer trained
on the bundled demo data and a randomly initialised (seeded) decoder from one of four
transformers architectures. Both are saved with ``save_pretrained`` so that
``AutoModelForCausalLM.from_pretrained(dir)`` and ``AutoTokenizer.from_pretrained(dir)`` load
them like any hub model.

Command line::

    python -m trainers.tiny --out DIR [--arch llama|qwen2|gpt_neox|gpt2] [--size xs|s] [--seed N]
        [--pretrain-steps N]
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
from trainers.data.paths import cache_root, demo_data_path

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase, PreTrainedTokenizerFast

ARCHS = ("llama", "qwen2", "gpt_neox", "gpt2")
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
RECIPE_VERSION = 2
PRETRAIN_LENGTH = 64  # tokens per pre-training sample
PRETRAIN_BATCH = 16
PRETRAIN_LR = 3e-3
"""Bump when a build changes (tokenizer, dimensions, init) so cached tiny models get rebuilt."""


@dataclass(frozen=True)
class TinySize:
    """Dimensions of one tiny model size."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int = 512


SIZES: dict[str, TinySize] = {
    "xs": TinySize(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256),
    "s": TinySize(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512),
}


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
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig, Qwen2Config

    _check_choice(arch, size)
    dims = SIZES[size]
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
        return GPT2Config(
            n_embd=dims.hidden_size,
            n_layer=dims.num_layers,
            n_head=dims.num_heads,
            n_inner=dims.intermediate_size,
            n_positions=dims.max_positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
    shared = {
        "hidden_size": dims.hidden_size,
        "num_hidden_layers": dims.num_layers,
        "num_attention_heads": dims.num_heads,
        "intermediate_size": dims.intermediate_size,
        "max_position_embeddings": dims.max_positions,
        **common,
    }
    if arch == "gpt_neox":
        return GPTNeoXConfig(**shared)
    if arch == "qwen2":
        return Qwen2Config(num_key_value_heads=dims.num_heads, **shared)
    return LlamaConfig(num_key_value_heads=dims.num_heads, **shared)


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
        arch: ``"llama"``, ``"qwen2"``, ``"gpt_neox"`` or ``"gpt2"``.
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
        if target.exists() and not is_complete(target):
            shutil.rmtree(target)  # incomplete, or built by an older recipe
        try:
            staging.rename(target)
        except OSError:
            # Another process finished the same build first; theirs is as good as ours.
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
