"""The CPU-side pieces of benchmarks/gpu_check.py: peak table, MFU arithmetic, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analysis.timemodel.hardware import gpu_peak_flops
from analysis.timemodel.model import ModelProfile
from benchmarks.gpu_check import flops_per_token, mfu, require_cuda
from common.errors import BadInputError

ROOT = Path(__file__).resolve().parent.parent
# 1B parameters, 16 layers of 2048, a vocabulary of 32k; 100k LoRA parameters per rank.
PROFILE = ModelProfile(1_000_000_000, 16, 2048, 32_000, 100_000)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA A10G", 125e12),
        ("NVIDIA GeForce RTX 4090", 165e12),
        ("Some Future GPU", None),
    ],
)
def test_peak_table_by_device_name(name: str, peak: float | None) -> None:
    assert gpu_peak_flops(name) == peak


def test_mfu_counts_two_thirds_of_6n_for_frozen_weights_and_6p_for_adapters() -> None:
    rank = 16
    trainable = rank * PROFILE.lora_parameters_per_rank
    per_token = flops_per_token(PROFILE, rank, 1024)
    assert per_token == pytest.approx(2 / 3 * 6 * PROFILE.total_parameters + 6 * trainable)
    with_attention = flops_per_token(PROFILE, rank, 1024, attention=True)
    assert with_attention - per_token == pytest.approx(12 * 16 * 2048 * 1024)
    # 50,000 tokens/s of a 1 B model on an H100: 4.0e9 FLOPs/token x 5e4 = 2.0e14 of 9.89e14.
    assert mfu(50_000, per_token, 989e12) == pytest.approx(50_000 * per_token / 989e12)
    assert mfu(50_000, per_token, 989e12) == pytest.approx(0.2035, abs=1e-3)
    assert mfu(50_000, per_token, None) is None


def test_require_cuda_is_bad_input() -> None:
    require_cuda(True, "")
    with pytest.raises(BadInputError, match="no CUDA device: nothing here"):
        require_cuda(False, "nothing here")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the check itself")
def test_without_cuda_exits_2_with_one_line_and_never_imports_optuna_or_mlflow(
    tmp_path: Path,
) -> None:
    out = tmp_path / "gpu.json"
    script = (
        "import json, sys\n"
        "import benchmarks.gpu_check as check\n"
        "code = check.run_cli(check.main, ['--json', sys.argv[1]])\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'optuna', 'mlflow'})\n"
        "print(json.dumps(loaded))\n"
        "sys.exit(code)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in proc.stderr.splitlines() if "Warning" not in line and line]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(errors) == 1 and "no CUDA device:" in errors[0], errors
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    assert not out.exists()


@pytest.mark.parametrize(
    ("device_name", "gpu"),
    [("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200 NVL", "H200")],
)
def test_the_lease_names_the_gpu_cuda_reports(device_name: str, gpu: str) -> None:
    from benchmarks.gpu_scale import gpu_name_for

    assert gpu_name_for(device_name) == gpu


def test_a_gpu_the_plan_does_not_know_is_bad_input() -> None:
    from benchmarks.gpu_scale import gpu_name_for

    with pytest.raises(BadInputError, match="knows no GPU named 'NVIDIA B200'"):
        gpu_name_for("NVIDIA B200")
