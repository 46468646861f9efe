"""What one training run measured."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TrainResult:
    """Measurements of one run. `timings` parts add up to `wall_seconds`.

    Micro-steps (one forward + backward of one micro-batch) and optimizer steps (gradient
    clipping, the optimizer update, scheduler and zeroing) are timed separately so the
    time model can fit each.
    """

    device: str
    precision: str
    runtime_reason: str
    trainable_parameters: int
    total_parameters: int
    lora_targets: list[str]
    lora_parameters_per_rank: int
    n_layers: int
    hidden_size: int
    vocab_size: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    max_length: int
    lora_r: int
    gradient_checkpointing: bool
    quantization: str = "none"  # the base's weights: "none" or "nf4" (QLoRA)
    levers: list[str] = field(default_factory=list)  # speed levers on (trainers.model.levers)
    optimizer_steps: int = 0
    total_steps: int = 0
    micro_step_seconds: list[float] = field(default_factory=list)
    micro_step_tokens: list[int] = field(default_factory=list)
    micro_step_seq_len: list[int] = field(default_factory=list)
    optimizer_step_seconds: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    train_losses: list[list[float]] = field(default_factory=list)  # [step, loss]
    eval_losses: list[list[float]] = field(default_factory=list)  # [step, loss]
    eval_records: list[dict[str, Any]] = field(default_factory=list)
    checkpoint_seconds: list[float] = field(default_factory=list)
    startup_seconds: float = 0.0
    # The base model was kept from an earlier run of this process (a study's later trial):
    # its start-up lacks the load a full run pays, so the time model does not learn from it.
    reused_base_model: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    wall_seconds: float = 0.0
    tokens_seen: int = 0
    samples_seen: int = 0  # training samples through the model (the data a run has seen)
    tokens_per_second: float = 0.0
    peak_memory_bytes: int = 0
    # CUDA: what the caching allocator held at its peak (torch.cuda.max_memory_reserved), what
    # nvidia-smi shows and what runs out; `peak_memory_bytes` is what tensors held. 0: CPU/MPS.
    peak_reserved_bytes: int = 0
    # In use as training starts, the base and the adapter attached (CUDA: allocated; CPU: the
    # process's RSS): in a study's worker, what an earlier trial left behind shows here.
    start_memory_bytes: int = 0
    final_train_loss: float | None = None
    final_eval_loss: float | None = None
    stop_reason: str | None = None
    dataset: dict[str, Any] = field(default_factory=dict)
    # finished | stopped_early | stopped_by_window | stopped_by_signal | stopped (a callback
    # asked) | gave_up
    status: str = "finished"
    resumed_from_step: int | None = None
    final_step: int = 0
    recoveries: list[str] = field(default_factory=list)  # one reason per recovery
    checkpoint_dir: str | None = None  # the newest checkpoint this run saved
    predicted_seconds: float | None = None  # the preset's full-run estimate (p50), when given
    # This run's wall time plus that of the runs it resumed from (as of their checkpoint).
    cumulative_wall_seconds: float = 0.0
    grad_norms: list[list[float]] = field(default_factory=list)  # [step, norm before clipping]
    max_grad_norm: float = 0.0  # the clip threshold (0: no clipping)
    best_step: int | None = None  # the evaluation with the lowest validation loss
    best_val_loss: float | None = None
    best_checkpoint: str | None = None  # the kept checkpoint with the lowest validation loss
    advice: list[str] = field(default_factory=list)  # overfitting / plateau, one line each
    data_loading: dict[str, Any] = field(default_factory=dict)  # workers, pin_memory, why

    @property
    def median_step_seconds(self) -> float:
        # The first steps pay for allocator warm-up and lazy initialisation.
        steps = self.step_seconds[2:] if len(self.step_seconds) > 4 else self.step_seconds
        return statistics.median(steps) if steps else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
