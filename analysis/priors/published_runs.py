"""Published LoRA fine-tuning measurements of time and peak memory, each with its setup.

Every row says where it was published (URL and the table or line), the model (a config
shipped in `analysis/planning/model_configs/`), the setup as published and what was measured. Rows
the plan cannot express (4-bit base weights, trained embeddings, sharded or multi-node
training, DPO) are kept with the reason, and counted apart; one node's plain data-parallel
runs are expressible (`gpus`). `held_out` rows are never used by the fit in
`analysis.priors.fit`: their errors are the honest ones.

Duration is compared as seconds per optimizer step: "s/it" as published, tokens/s converted
with the tokens of one step, "s per 250 steps" divided by 250.

The rows are data (`published_runs.json`): per source, the fields its rows share and each
row's own; the Qwen README's table is expanded into one row per model and length. Long texts
are named once under "texts" and a field may refer to one ({"text": NAME, "args": {...},
"then": SUFFIX}). Memory is given as published: GiB, bytes ("memory_bytes") or decimal GB;
a speed not published is null.

A lease's own measurements (`benchmarks/lease/ingest.py`) are groups of the same shape, one
file per lease in `measured/`, loaded after the published groups.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

RUNS_FILE = "published_runs.json"
MEASURED_FOLDER = "measured"  # in analysis.priors: one group per lease


@dataclass(frozen=True)
class PublishedRun:
    """One published measurement and the setup it was measured with.

    Attributes:
        name: Short label.
        source: URL.
        where: The table, row and column (or file and field) the numbers are in.
        model: Name of a config in `analysis/planning/model_configs/`.
        gpu: A `analysis.timemodel.gpus` name.
        framework: Training code as published.
        precision: Training precision.
        micro_batch_size: Samples (or packed rows) per micro-step.
        gradient_accumulation_steps: Micro-steps per optimizer step.
        max_length: Truncation (or packing) length.
        tokens_per_sample: Mean tokens per sample after truncation (max_length when padded
            to it or packed).
        longest_sample: Longest sample; None: max_length.
        lengths_vary: The samples are of different lengths and not packed, so the
            micro-batch's shape changes from step to step.
        gradient_checkpointing: As published; `inferred` says when it was not stated.
        attention: flash_attention_2 | sdpa | eager.
        packing: Samples packed into full rows.
        padding_free: The packed samples keep their attention inside each sample (a micro-batch
            flattened into one row, position ids restarting: `--packing padding_free`), not
            whole rows attending across samples.
        lora_r: LoRA rank.
        lora_targets: "all-linear" or module names (HF names).
        logits_fp32: The loss upcasts the full logits to fp32.
        quantization: "none", or "nf4" (the base's linear layers in 4 bits: QLoRA).
        gpus: GPUs the run trained on, data-parallel (all of them counted: several nodes
            make it one number); its micro-batch, accumulation and memory are each GPU's.
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
    lengths_vary: bool = False
    padding_free: bool = False
    notes: str = ""
    expressible: bool = True
    why_not: str = ""
    held_out: bool = False
    quantization: str = "none"
    extra: dict[str, str] = field(default_factory=dict)
    gpus: int = 1  # data-parallel processes; micro-batch, accumulation and memory per GPU

    @property
    def tokens_per_step(self) -> float:
        """Tokens of one optimizer step (unpadded mean), on all its GPUs (a published tokens/s
        of several GPUs is read as their sum)."""
        batch = self.micro_batch_size * self.gradient_accumulation_steps * self.gpus
        return batch * self.tokens_per_sample

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


def _text(value: Any, texts: Mapping[str, str]) -> Any:
    """A field's value, with a reference to a named text expanded."""
    if not isinstance(value, dict) or "text" not in value:  # `extra` is a dict of its own
        return value
    return texts[value["text"]].format(**value.get("args", {})) + value.get("then", "")


def _run(values: Mapping[str, Any], texts: Mapping[str, str]) -> PublishedRun:
    """One row: its texts expanded, memory in GiB, an unpublished speed NaN."""
    row = {key: _text(value, texts) for key, value in values.items()}
    if "memory_bytes" in row:
        row["memory_gib"] = row.pop("memory_bytes") / 2**30
    if isinstance(row.get("lora_targets"), list):
        row["lora_targets"] = tuple(row["lora_targets"])
    if row.get("time_value", 0) is None:
        row["time_value"] = float("nan")
    return PublishedRun(**row)


def _qwen_rows(qwen: Mapping[str, Any], texts: Mapping[str, str]) -> Iterator[PublishedRun]:
    """The Qwen README's LoRA rows: (GB as 'G', s/it) per model and length; 'G' is read as
    GiB, the larger reading, so that a bound that holds it holds the other. Held out: a whole
    model size and single points of the others."""
    held_out = {tuple(pair) for pair in qwen["held_out"]}
    for model, lengths in qwen["lora"].items():
        label = qwen["rows"][model]
        for length_key, (memory, seconds) in lengths.items():
            length = int(length_key)
            yield _run(
                {
                    **qwen["common"],
                    "name": f"Qwen {label.split()[0]} LoRA {length}",
                    "where": {"text": "qwen_table", "args": {"row": label, "length": length}},
                    "model": model,
                    "max_length": length,
                    "tokens_per_sample": length,
                    "time_value": seconds,
                    "memory_gib": memory,
                    "held_out": model in qwen["held_out_models"] or (model, length) in held_out,
                },
                texts,
            )


def _load() -> tuple[PublishedRun, ...]:
    package = resources.files("analysis.priors")
    data = json.loads(package.joinpath(RUNS_FILE).read_text("utf-8"))
    texts = data["texts"]
    return (
        *_qwen_rows(data["qwen"], texts),
        *(
            _run({**group["common"], **row}, texts)
            for group in data["groups"]
            for row in group["runs"]
        ),
        *measured_runs(package.joinpath(MEASURED_FOLDER)),
    )


def measured_runs(folder: Traversable) -> tuple[PublishedRun, ...]:
    """The rows of every group file in `folder` (a lease's, written by
    `benchmarks.lease.ingest`), in file-name order; none when there is no such folder."""
    if not folder.is_dir():
        return ()
    groups = [json.loads(f.read_text("utf-8"))
              for f in sorted(folder.iterdir(), key=lambda f: f.name)
              if f.name.endswith(".json")]  # fmt: skip
    return tuple(_run({**g["common"], **row}, {}) for g in groups for row in g["runs"])


PUBLISHED_RUNS: tuple[PublishedRun, ...] = _load()


def expressible_runs() -> tuple[PublishedRun, ...]:
    """The rows the plan can express."""
    return tuple(run for run in PUBLISHED_RUNS if run.expressible)
