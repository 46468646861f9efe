"""Published LoRA fine-tuning measurements of time and peak memory, each with its setup.

Every row says where it was published (URL and the table or line), the model (a config
shipped in `analysis/model_configs/`), the setup as published and what was measured. Rows
the plan cannot express (4-bit base weights, trained embeddings, several GPUs, DPO) are kept
with the reason, and counted apart. `held_out` rows are never used by the fit in
`analysis.published_priors`: their errors are the honest ones.

Duration is compared as seconds per optimizer step: "s/it" as published, tokens/s converted
with the tokens of one step, "s per 250 steps" divided by 250.
"""

from __future__ import annotations

from dataclasses import dataclass, field

QWEN_README = "https://github.com/QwenLM/Qwen/blob/main/README.md"
QWEN_TABLE = (
    "'Profiling of Memory and Speed' table (single A100-SXM4-80G, CUDA 11.8, PyTorch 2.0, "
    "flash attention 2, batch size 1, gradient accumulation 8), row {row}, column {length}"
)
QWEN_SETUP = (
    "finetune.py: LoraArguments r=64, targets c_attn/c_proj/w1/w2 (every linear), right-padded "
    "to model_max_length; finetune_lora_single_gpu.sh: --bf16 --gradient_checkpointing"
)
TORCHTUNE_README = "https://github.com/pytorch/torchtune/blob/main/README.md"
TORCHTUNE_TABLE = (
    "'Memory and training speed' table (batch size 2, no gradient accumulation, packed to "
    "2048, torch compile on; Tokens/sec measured over one epoch), row '{row}'"
)
TORCHTUNE_SETUP = (
    "recipe config recipes/configs/llama3_1/8B_lora_single_device.yaml (read at commit "
    "2943c61e): lora_attn_modules q_proj/v_proj/output_proj, apply_lora_to_mlp, rank 8, "
    "alpha 16, enable_activation_checkpointing True, a chunked (linear) cross-entropy loss: no "
    "full fp32 logits; memory is peak reserved (the README's earlier 'Finetuning resource "
    "requirements' note)"
)
PEFT_RESULTS = (
    "https://github.com/huggingface/peft/blob/main/method_comparison/MetaMathQA/results/{file}"
)
PEFT_WHERE = (
    "train_config (bf16, batch 4, max_seq_length 768, no compile, attn_implementation null = "
    "sdpa), train_info.accelerator_memory_max (cuda_memory_max in older files), median "
    "'train time' per 250 steps; 4,198,051 train tokens over 20,000 samples = 210 per sample; "
    "system_info: NVIDIA L40S"
)


@dataclass(frozen=True)
class PublishedRun:
    """One published measurement and the setup it was measured with.

    Attributes:
        name: Short label.
        source: URL.
        where: The table, row and column (or file and field) the numbers are in.
        model: Name of a config in `analysis/model_configs/`.
        gpu: A `analysis.gpus` name.
        framework: Training code as published.
        precision: Training precision.
        micro_batch_size: Samples (or packed rows) per micro-step.
        gradient_accumulation_steps: Micro-steps per optimizer step.
        max_length: Truncation (or packing) length.
        tokens_per_sample: Mean tokens per sample after truncation (max_length when padded
            to it or packed).
        longest_sample: Longest sample; None: max_length.
        gradient_checkpointing: As published; `inferred` says when it was not stated.
        attention: flash_attention_2 | sdpa | eager.
        packing: Samples packed into full rows.
        lora_r: LoRA rank.
        lora_targets: "all-linear" or module names (HF names).
        logits_fp32: The loss upcasts the full logits to fp32.
        time_measure: "s/it", "tokens/s" or "s per 250 steps".
        time_value: The published number in that measure.
        memory_measure: "reserved" or "allocated" (as published, or as read; see notes).
        memory_gib: Published peak, in GiB.
        notes: Anything read rather than stated.
        expressible: False: the plan cannot express this setup (`why_not` says why).
        why_not: The reason.
        held_out: Kept out of the fit.
    """

    name: str
    source: str
    where: str
    model: str
    gpu: str
    framework: str
    precision: str
    micro_batch_size: int
    gradient_accumulation_steps: int
    max_length: int
    tokens_per_sample: float
    gradient_checkpointing: bool
    attention: str
    packing: bool
    lora_r: int
    lora_targets: str | tuple[str, ...]
    logits_fp32: bool
    time_measure: str
    time_value: float
    memory_measure: str
    memory_gib: float
    longest_sample: int | None = None
    notes: str = ""
    expressible: bool = True
    why_not: str = ""
    held_out: bool = False
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def tokens_per_step(self) -> float:
        """Tokens of one optimizer step (unpadded mean)."""
        return self.micro_batch_size * self.gradient_accumulation_steps * self.tokens_per_sample

    @property
    def seconds_per_step(self) -> float:
        """The published speed as seconds per optimizer step."""
        if self.time_measure == "s/it":
            return self.time_value
        if self.time_measure == "tokens/s":
            return self.tokens_per_step / self.time_value
        if self.time_measure == "s per 250 steps":
            return self.time_value / 250.0
        raise ValueError(f"unknown time_measure {self.time_measure!r}")


# Qwen README, LoRA rows: (model, row label, {length: (GB as 'G', s/it)}); 'G' is read as
# GiB, the larger reading, so that a bound that holds it holds the other.
_QWEN_LORA = {
    "qwen-1.8b": {256: (6.7, 1.0), 512: (7.4, 1.0), 1024: (8.4, 1.1), 2048: (11.0, 1.7),
                  4096: (16.2, 3.3), 8192: (21.8, 6.8)},
    "qwen-7b": {256: (20.1, 1.2), 512: (20.4, 1.5), 1024: (21.5, 2.8), 2048: (23.8, 5.2),
                4096: (29.7, 10.1), 8192: (36.6, 21.3)},
    "qwen-14b": {256: (34.6, 1.6), 512: (35.1, 2.4), 1024: (35.3, 4.4), 2048: (37.4, 8.4),
                 4096: (42.5, 17.0), 8192: (55.2, 36.0)},
}  # fmt: skip
_QWEN_ROW = {"qwen-1.8b": "1.8B LoRA", "qwen-7b": "7B LoRA", "qwen-14b": "14B LoRA"}
# Held out: a whole model size (14B) and single points of the others.
_QWEN_HELD_OUT = {("qwen-14b", n) for n in _QWEN_LORA["qwen-14b"]} | {
    ("qwen-7b", 1024),
    ("qwen-1.8b", 4096),
}


def _qwen(model: str, length: int, memory: float, seconds: float) -> PublishedRun:
    return PublishedRun(
        name=f"Qwen {_QWEN_ROW[model].split()[0]} LoRA {length}",
        source=QWEN_README,
        where=QWEN_TABLE.format(row=_QWEN_ROW[model], length=length),
        model=model,
        gpu="A100-80GB",
        framework="transformers Trainer + PEFT (Qwen finetune.py)",
        precision="bf16",
        micro_batch_size=1,
        gradient_accumulation_steps=8,
        max_length=length,
        tokens_per_sample=length,
        gradient_checkpointing=True,
        attention="flash_attention_2",
        packing=False,
        lora_r=64,
        lora_targets="all-linear",
        logits_fp32=True,
        time_measure="s/it",
        time_value=seconds,
        memory_measure="reserved",
        memory_gib=memory,
        notes=QWEN_SETUP + "; memory measure not stated (read as reserved, 'G' as GiB)",
        held_out=(model, length) in _QWEN_HELD_OUT,
    )


_TORCHTUNE_COMMON = dict(
    source=TORCHTUNE_README,
    model="llama-3.1-8b",
    framework="torchtune lora_finetune_single_device, torch.compile",
    precision="bf16",
    micro_batch_size=2,
    gradient_accumulation_steps=1,
    max_length=2048,
    tokens_per_sample=2048.0,
    attention="sdpa",
    packing=True,
    lora_r=8,
    lora_targets=("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    logits_fp32=False,
    time_measure="tokens/s",
    memory_measure="reserved",
)

_PEFT_COMMON = dict(
    model="llama-3.2-3b",
    gpu="L40S",
    framework="PEFT method_comparison (plain PyTorch loop, transformers 4.52-4.57)",
    precision="bf16",
    micro_batch_size=4,
    gradient_accumulation_steps=1,
    max_length=768,
    tokens_per_sample=4_198_051 / 20_000,
    gradient_checkpointing=False,
    attention="sdpa",
    packing=False,
    logits_fp32=True,
    time_measure="s per 250 steps",
    memory_measure="reserved",
    notes="peak over the run includes evaluation (batch 50, generation to 800 tokens); "
    "accelerator_memory_max read as reserved (the file's other memory fields are reserved)",
)

PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    *(
        _qwen(model, length, memory, seconds)
        for model, rows in _QWEN_LORA.items()
        for length, (memory, seconds) in rows.items()
    ),
    PublishedRun(
        name="torchtune Llama-3.1-8B LoRA, RTX 4090",
        where=TORCHTUNE_TABLE.format(row="Llama 3.1 8B | LoRA | 1x 4090 | 16.2 GiB | 3083"),
        gpu="RTX4090",
        gradient_checkpointing=True,
        time_value=3083,
        memory_gib=16.2,
        notes=TORCHTUNE_SETUP + "; activation checkpointing on as in the recipe config",
        **_TORCHTUNE_COMMON,  # type: ignore[arg-type]
    ),
    PublishedRun(
        name="torchtune Llama-3.1-8B LoRA, RTX A6000",
        where=TORCHTUNE_TABLE.format(row="Llama 3.1 8B | LoRA | 1x A6000 | 30.3 GiB | 4699"),
        gpu="A6000",
        gradient_checkpointing=False,
        time_value=4699,
        memory_gib=30.3,
        notes=TORCHTUNE_SETUP + "; activation checkpointing not stated: 30.3 GiB against the "
        "4090's 16.2 GiB for the same recipe says it was off here (inferred)",
        held_out=True,
        **_TORCHTUNE_COMMON,  # type: ignore[arg-type]
    ),
    PublishedRun(
        name="PEFT Llama-3.2-3B LoRA r32 q,v, L40S",
        source=PEFT_RESULTS.format(file="lora--llama-3.2-3B-rank32.json"),
        where=PEFT_WHERE,
        lora_r=32,
        lora_targets=("q_proj", "v_proj"),
        time_value=31.0,
        memory_gib=22_273_851_392 / 2**30,
        **_PEFT_COMMON,  # type: ignore[arg-type]
    ),
    PublishedRun(
        name="PEFT Llama-3.2-3B LoRA r64 q,v, L40S",
        source=PEFT_RESULTS.format(file="lora--llama-3.2-3B-rank64.json"),
        where=PEFT_WHERE,
        lora_r=64,
        lora_targets=("q_proj", "v_proj"),
        time_value=31.5,
        memory_gib=22_540_189_696 / 2**30,
        held_out=True,
        **_PEFT_COMMON,  # type: ignore[arg-type]
    ),
    PublishedRun(
        name="PEFT Llama-3.2-3B LoRA r10 MLP, L40S",
        source=PEFT_RESULTS.format(file="lora--llama-3.2-3B-rank10-target-mlp.json"),
        where=PEFT_WHERE,
        lora_r=10,
        lora_targets=("gate_proj", "up_proj", "down_proj"),
        time_value=36.3,
        memory_gib=24_712_839_168 / 2**30,
        **_PEFT_COMMON,  # type: ignore[arg-type]
    ),
    # ---------------------------------------------------------------- listed apart
    PublishedRun(
        name="Qwen 7B Q-LoRA 2048",
        source=QWEN_README,
        where=QWEN_TABLE.format(row="7B Q-LoRA", length=2048),
        model="qwen-7b",
        gpu="A100-80GB",
        framework="transformers Trainer + PEFT + bitsandbytes",
        precision="bf16",
        micro_batch_size=1,
        gradient_accumulation_steps=8,
        max_length=2048,
        tokens_per_sample=2048,
        gradient_checkpointing=True,
        attention="flash_attention_2",
        packing=False,
        lora_r=64,
        lora_targets="all-linear",
        logits_fp32=True,
        time_measure="s/it",
        time_value=7.0,
        memory_measure="reserved",
        memory_gib=13.9,
        expressible=False,
        why_not="4-bit base weights (Qwen-7B-Chat-Int4): the plan counts 16-bit weights (QLoRA is issue 27)",
    ),  # fmt: skip
    PublishedRun(
        name="Qwen 7B LoRA (emb) 8192",
        source=QWEN_README,
        where=QWEN_TABLE.format(row="7B LoRA (emb)", length=8192),
        model="qwen-7b",
        gpu="A100-80GB",
        framework="transformers Trainer + PEFT",
        precision="bf16",
        micro_batch_size=1,
        gradient_accumulation_steps=8,
        max_length=8192,
        tokens_per_sample=8192,
        gradient_checkpointing=True,
        attention="flash_attention_2",
        packing=False,
        lora_r=64,
        lora_targets="all-linear",
        logits_fp32=True,
        time_measure="s/it",
        time_value=21.7,
        memory_measure="reserved",
        memory_gib=48.5,
        expressible=False,
        why_not="embedding and output layer trained in full (modules_to_save): the plan counts adapters only",
    ),  # fmt: skip
    PublishedRun(
        name="torchtune Llama-3.1-8B QLoRA, RTX 4090",
        source=TORCHTUNE_README,
        where=TORCHTUNE_TABLE.format(row="Llama 3.1 8B | QLoRA | 1x 4090 | 7.4 GiB | 2413"),
        model="llama-3.1-8b",
        gpu="RTX4090",
        framework="torchtune, torch.compile",
        precision="bf16",
        micro_batch_size=2,
        gradient_accumulation_steps=1,
        max_length=2048,
        tokens_per_sample=2048,
        gradient_checkpointing=True,
        attention="sdpa",
        packing=True,
        lora_r=8,
        lora_targets="all-linear",
        logits_fp32=False,
        time_measure="tokens/s",
        time_value=2413,
        memory_measure="reserved",
        memory_gib=7.4,
        expressible=False,
        why_not="4-bit NF4 base weights: the plan counts 16-bit weights (QLoRA is issue 27)",
    ),  # fmt: skip
    PublishedRun(
        name="LongLoRA Llama-2-7B plain LoRA 8192",
        source="https://arxiv.org/abs/2309.12307",
        where="Table 12 (plain LoRA, 8,192 tokens: 25.7 GB per GPU)",
        model="llama-2-7b",
        gpu="A100-80GB",
        framework="LongLoRA fine-tune.py, DeepSpeed ZeRO-2, 8 x A100",
        precision="bf16",
        micro_batch_size=1,
        gradient_accumulation_steps=8,
        max_length=8192,
        tokens_per_sample=8192,
        gradient_checkpointing=True,
        attention="flash_attention_2",
        packing=False,
        lora_r=8,
        lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
        logits_fp32=True,
        time_measure="s/it",
        time_value=float("nan"),
        memory_measure="reserved",
        memory_gib=25.7 * 1e9 / 2**30,
        expressible=False,
        why_not="8 GPUs with DeepSpeed ZeRO-2: reduce and all-gather buckets per GPU the single-GPU plan does not hold",
    ),  # fmt: skip
    PublishedRun(
        name="Qwen2.5-7B LoRA DPO 2048",
        source="https://github.com/superkaiba/explore-persona-space/issues/36",
        where="issue body, peak memory 19.08 GB (as tabulated in odyn-network/benchmark-finetune-dpo-v1)",
        model="qwen2.5-7b",
        gpu="unknown",
        framework="TRL DPOTrainer + PEFT",
        precision="bf16",
        micro_batch_size=2,
        gradient_accumulation_steps=1,
        max_length=2048,
        tokens_per_sample=2048,
        gradient_checkpointing=True,
        attention="sdpa",
        packing=False,
        lora_r=16,
        lora_targets="all-linear",
        logits_fp32=False,
        time_measure="s/it",
        time_value=float("nan"),
        memory_measure="reserved",
        memory_gib=19.08 * 1e9 / 2**30,
        expressible=False,
        why_not="DPO (log-probabilities of chosen and rejected, no logits gradient kept) on a GPU not named",
    ),  # fmt: skip
    PublishedRun(
        name="LLaMA-Factory LLaMA2-7B LoRA HF+FA2 1024",
        source="https://github.com/hiyouga/LLaMA-Factory/wiki/Performance-comparison",
        where="first table, row 'HF+FA2 | 16 | 2,954 | 17GB' (batch 4, accumulation 2, rank 8, all modules, max length 1024)",
        model="llama-2-7b",
        gpu="unknown",
        framework="LLaMA-Factory (transformers + PEFT)",
        precision="bf16",
        micro_batch_size=4,
        gradient_accumulation_steps=2,
        max_length=1024,
        tokens_per_sample=1024,
        gradient_checkpointing=True,
        attention="flash_attention_2",
        packing=False,
        lora_r=8,
        lora_targets="all-linear",
        logits_fp32=True,
        time_measure="tokens/s",
        time_value=2954,
        memory_measure="reserved",
        memory_gib=17.0,
        expressible=False,
        why_not="the table names no GPU (the page's later table says A100 40GB for another run)",
    ),  # fmt: skip
)


def expressible_runs() -> tuple[PublishedRun, ...]:
    """The rows the plan can express."""
    return tuple(run for run in PUBLISHED_RUNS if run.expressible)
