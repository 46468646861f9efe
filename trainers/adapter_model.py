"""A finished run's LoRA adapter as an MLflow model: adapter weights only, the base model named.

`save_adapter_model` writes an MLflow `transformers` model folder (MLmodel, the PEFT adapter,
the tokenizer) that references the base model by its local path (MLflow's `base_model_path`),
so a 7B base is never copied. The MLflow writer then logs that folder as a LoggedModel of the
run (and registers it when asked), or keeps it in its spool while the server is away.
`mlflow.transformers.load_model("models:/<id>")` loads the base model from that path and
applies the adapter.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from common.files import replace_folder

MODEL_FOLDER = "mlflow-model"  # in the run's output folder
ADAPTER_MODEL_NAME = "lora-adapter"  # the LoggedModel's name in the run


def final_adapter(best_checkpoint: str | None, checkpoint_dir: str | None) -> Path | None:
    """The adapter a finished run hands over: its best kept checkpoint, else its newest one."""
    for folder in (best_checkpoint, checkpoint_dir):
        if folder and (Path(folder) / "adapter_model.safetensors").is_file():
            return Path(folder)
    return None


def save_adapter_model(adapter_dir: str | Path, base_model: str | Path, out: str | Path) -> Path:
    """Write `adapter_dir` (a PEFT checkpoint) as an MLflow transformers model folder at `out`.

    The folder is built beside `out` and moved into place, replacing an older one.

    Returns:
        The folder written.
    """
    import mlflow.transformers
    import peft
    import torch
    import transformers
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_path = str(Path(base_model).resolve())
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_path), str(adapter_dir)
    )
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    built = staging / "model"
    try:
        mlflow.transformers.save_model(
            transformers_model={"model": model, "tokenizer": tokenizer},
            path=str(built),
            task="text-generation",
            base_model_path=base_path,
            # Stated, not inferred: inference loads the model again in a subprocess.
            pip_requirements=[
                f"torch=={torch.__version__.split('+')[0]}",
                f"transformers=={transformers.__version__}",
                f"peft=={peft.__version__}",
                f"mlflow=={mlflow.__version__}",
            ],
        )
        replace_folder(built, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
