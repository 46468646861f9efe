#!/usr/bin/env bash
# The lease's --smoke under the device image's libraries, on the CPU, before any device time.
#
# The suite runs `benchmarks/gpu_lease.py --smoke` with this project's pins (transformers 5.24
# and the rest of FACTS.md). The lent machine runs the lease under its image's python3 with its
# own packages (transformers 5.17.0, accelerate 1.15.0, huggingface_hub 1.33.0, tokenizers
# 0.23.2, safetensors 0.8.0, peft 0.21: the device tool's KINDS.md, pip list row, 2026-11) plus
# only the wheels `.whl/` carries. An API this project uses that the image's transformers lacks,
# or a module neither the image nor the wheels hold, would otherwise first show on the clock.
#
#     scripts/gpu_wheels.sh && scripts/gpu_image_smoke.sh
#
# It builds a venv (VENV, default /tmp/hpo-image-venv) with those versions, the carried wheels'
# pins (without their dependencies, as on the device) and the image's own libraries the lease
# imports; lists any installed distribution that neither the image (KINDS.md, where this
# machine has it) nor the wheels hold; then runs every part's smoke from a clean environment
# (`env -i`, no PYTHONPATH: the lease finds the repository from its own path) and exits with
# the lease's code. Its JSON lands in OUT (default /tmp/hpo-image-smoke).
#
# Stand-ins, for what this machine cannot install: torch 2.13.0's CPU build (on this disk) for
# the image's 2.11 (CUDA 13), so Python 3.11 for its 3.12 (`scripts/gpu_wheels.sh --check`
# imports the wheel set under 3.12); numpy 2.4 for its 2.5 (which needs 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-/tmp/hpo-image-venv}
OUT=${OUT:-/tmp/hpo-image-smoke}
PYTHON311=${PYTHON311:-$(command -v python3.11 || echo python3)}

IMAGE=(
  torch==2.13.0 transformers==5.17.0 "peft>=0.21,<0.22" accelerate==1.15.0
  huggingface_hub==1.33.0 tokenizers==0.23.2 safetensors==0.8.0
  # The image's own libraries that the lease (or a wheel it carries) imports.
  scipy pandas pyarrow psutil xxhash protobuf requests matplotlib
)

if ! ls .whl/*.whl > /dev/null 2>&1; then
  echo "gpu_image_smoke: no wheels in .whl/: run scripts/gpu_wheels.sh first" >&2
  exit 2
fi
# The carried set at its versions: name==version from each wheel's file name.
mapfile -t CARRIED < <(for w in .whl/*.whl; do basename "$w" | awk -F- '{print $1 "==" $2}'; done)

rm -rf "$VENV" "$OUT"
"$PYTHON311" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "${IMAGE[@]}"
# --find-links: the slimmed bitsandbytes and the other py3 wheels come from .whl/ itself.
"$VENV/bin/python" -m pip install -q --no-deps --find-links .whl "${CARRIED[@]}"
"$VENV/bin/python" -c "import transformers, peft, accelerate, torch
print('image stand-in: transformers', transformers.__version__, 'peft', peft.__version__,
      'accelerate', accelerate.__version__, 'torch', torch.__version__)"

"$VENV/bin/python" scripts/gpu_wheels_check.py outside .whl

code=0
env -i PATH=/usr/bin:/bin HOME="$HOME" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 \
  "$VENV/bin/python" benchmarks/gpu_lease.py --smoke --out "$OUT" || code=$?
echo "gpu_image_smoke: lease smoke exit $code; JSON and log in $OUT"
exit $code
