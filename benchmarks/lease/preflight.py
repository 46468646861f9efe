"""Lease part 1 (~30 s): what the machine is, its two ceilings, and the pieces the rest needs.

Versions (read from package metadata, nothing imported for it), the device and its bf16 and
TF32 state; a bf16 matrix product and a device-to-device copy as the two ceilings
(METHOD.md); bitsandbytes' `Linear4bit` (NF4) forward and backward on the device against
the de-quantized weight in higher precision; MLflow's GPU metrics collector (what a
study's runs log as `system/gpu_*`); and SDPA at 8,192 tokens with `is_causal` against an
explicit causal mask and a sliding-window mask: which kernel runs (the aten op the
dispatcher picked, read by the profiler) and how long it takes. The last says whether a
model that hands SDPA a mask (Mistral's sliding window, padding-free rows' block-diagonal
mask) leaves the fast kernels, which `benchmarks/gpu_scale.py` suggested.

    python -m benchmarks.lease.preflight --out preflight.json --work DIR [--smoke]
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lease.part import (  # noqa: E402
    Record,
    cuda_or_smoke,
    first_line,
    guarded,
    median_seconds,
    parser,
)
from common.cli import run_cli  # noqa: E402

PACKAGES = ("torch", "transformers", "peft", "accelerate", "triton", "optuna", "mlflow-skinny",
            "sqlalchemy", "alembic", "bitsandbytes", "liger-kernel", "nvidia-ml-py", "datasets")  # fmt: skip
# (tokens, heads, head dim, sliding window): a 7B model's attention at the lease's longest row.
SDPA_SHAPE = (8192, 32, 128, 4096)
SDPA_SMOKE = (256, 4, 16, 128)


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def device_state(device: str) -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"device": device, "torch_cuda": torch.version.cuda}
    # As this process starts, before the trainer turns TF32 on (transformers 5 does it through
    # torch's newer fp32_precision settings; after that, the legacy getters raise).
    readers = {
        "fp32_precision": lambda: getattr(torch.backends, "fp32_precision"),  # noqa: B009
        "cuda_matmul_fp32_precision": lambda: torch.backends.cuda.matmul.fp32_precision,
        "cudnn_fp32_precision": lambda: torch.backends.cudnn.fp32_precision,
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "cuda_matmul_allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
    }
    for key, read in readers.items():
        try:
            state[key] = read()
        except Exception as exc:  # an API this torch lacks, or one the other API locked
            state[key] = f"unreadable: {first_line(exc)}"
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        state.update(name=props.name, capability=f"{props.major}.{props.minor}",
                     memory_gib=props.total_memory / 2**30,
                     multiprocessors=props.multi_processor_count,
                     bf16_supported=torch.cuda.is_bf16_supported())  # fmt: skip
    else:
        state.update(name=platform.processor() or platform.machine(), bf16_supported=False)
    return state


def _sync(device: str) -> Any:
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def ceilings(device: str, smoke: bool) -> dict[str, Any]:
    """A bf16 (fp32 on the CPU) matrix product's FLOP/s and a copy's bytes/s, on random data."""
    import torch

    n = 256 if smoke else 8192
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    matmul = median_seconds(lambda: a @ b, 3 if smoke else 10, _sync(device))
    elements = (4 if smoke else 1024) * 2**20 // 4  # 4 MiB / 1 GiB of fp32
    src = torch.randn(elements, device=device)
    dst = torch.empty_like(src)
    copy = median_seconds(lambda: dst.copy_(src), 3 if smoke else 10, _sync(device))
    return {
        "matmul_n": n,
        "matmul_dtype": str(dtype),
        "matmul_tflops": 2 * n**3 / matmul / 1e12,
        "copy_bytes": 2 * src.numel() * 4,
        "copy_gbps": 2 * src.numel() * 4 / copy / 1e9,  # read + written
    }


def nf4_linear(device: str, smoke: bool) -> dict[str, Any]:
    """bitsandbytes' Linear4bit forward and backward against its de-quantized weight."""
    import bitsandbytes as bnb
    import torch

    features = 256 if smoke else 4096
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    dense = torch.nn.Linear(features, features, bias=False)
    layer = bnb.nn.Linear4bit(features, features, bias=False, compute_dtype=dtype,
                              quant_type="nf4", compress_statistics=True)  # fmt: skip
    layer.weight = bnb.nn.Params4bit(dense.weight.data.clone(), requires_grad=False,
                                     quant_type="nf4", compress_statistics=True)  # fmt: skip
    layer = layer.to(device)
    x = torch.randn(8, features, device=device, dtype=dtype, requires_grad=True)
    out = layer(x)
    grad = torch.randn_like(out)
    out.backward(grad)
    packed = layer.weight
    assert isinstance(packed, bnb.nn.Params4bit) and x.grad is not None
    weight = bnb.functional.dequantize_4bit(packed.data, packed.quant_state)
    weight64 = weight.double()
    ref = x.detach().double() @ weight64.t()
    ref_grad = grad.double() @ weight64
    err = float((out.detach().double() - ref).norm() / ref.norm())
    grad_err = float((x.grad.double() - ref_grad).norm() / ref_grad.norm())
    nf4_vs_dense = float(
        (weight.float().cpu() - dense.weight.detach()).norm() / dense.weight.norm()
    )
    return {
        "packed_dtype": str(layer.weight.dtype),
        "forward_rel_error": err,
        "input_grad_rel_error": grad_err,
        "nf4_weight_rel_error": nf4_vs_dense,  # NF4's own rounding: about 0.1 on Gaussians
        "ok": err < 2e-2 and grad_err < 2e-2 and 0.0 < nf4_vs_dense < 0.3,
    }


def gpu_metrics() -> dict[str, Any]:
    """What MLflow's GPU collector reads here (a study's runs log it as system/gpu_*)."""
    from trainers.system_metrics import collectors

    found = collectors()
    gpu = [c for c in found if "GPU" in type(c).__name__ or "ROCM" in type(c).__name__]
    out: dict[str, Any] = {"collectors": [type(c).__name__ for c in found]}
    if gpu:
        gpu[0].collect_metrics()
        out["gpu_metrics"] = sorted(gpu[0].metrics)
    return out


def sdpa(device: str, smoke: bool) -> list[dict[str, Any]]:
    """SDPA with is_causal, an explicit causal mask and a sliding window: kernel and time."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    tokens, heads, dim, window = SDPA_SMOKE if smoke else SDPA_SHAPE
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = (torch.randn(1, heads, tokens, dim, device=device, dtype=dtype) for _ in range(3))
    i = torch.arange(tokens, device=device)
    causal = i[None, :] <= i[:, None]
    sliding = causal & (i[:, None] - i[None, :] < window)
    cases: dict[str, dict[str, Any]] = {
        "is_causal": {"is_causal": True},
        "causal_mask": {"attn_mask": causal},
        "sliding_window_mask": {"attn_mask": sliding},
    }
    rows = []
    reference = None
    for name, kwargs in cases.items():

        def run(kwargs: dict[str, Any] = kwargs) -> Any:
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

        seconds = median_seconds(run, 2 if smoke else 5, _sync(device))
        # The CPU side names the aten kernel; CUDA's side needs CUPTI, which a sandbox
        # (the H200 machines run under gVisor) may not give.
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = run()
            _sync(device)()
        ops = sorted({e.name for e in prof.events() if e.name.startswith("aten::_scaled_dot")})
        if reference is None:
            reference = out.float()
        rows.append({
            "case": name, "tokens": tokens, "heads": heads, "head_dim": dim,
            "window": window if name == "sliding_window_mask" else None,
            "ms": 1e3 * seconds, "kernels": ops,
            # The causal mask and is_causal compute the same function.
            "rel_diff_vs_is_causal": float((out.float() - reference).norm() / reference.norm())
            if name == "causal_mask" else None,
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    record = Record(args.out, "preflight", args.budget_seconds)
    record.set("versions", versions())
    device = cuda_or_smoke(args.smoke)
    guarded(record, "device", lambda: device_state(device))
    guarded(record, "ceilings", lambda: ceilings(device, args.smoke))
    guarded(record, "nf4_linear", lambda: nf4_linear(device, args.smoke))
    guarded(record, "gpu_metrics", gpu_metrics)
    guarded(record, "sdpa", lambda: sdpa(device, args.smoke))
    record.finish()
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
