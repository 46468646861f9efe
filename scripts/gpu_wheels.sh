#!/usr/bin/env bash
# Builds .whl/: the wheels a lent GPU machine lacks for benchmarks/gpu_lease.py (a study needs
# Optuna and MLflow; QLoRA needs bitsandbytes; the Liger lever needs liger-kernel), for the
# device image's Python (CPython 3.12, manylinux x86_64). That image has torch, transformers,
# peft, accelerate, numpy, scipy, pandas, pyarrow, psutil, nvidia-ml-py, triton and the rest
# of its list (the device tool's KINDS.md); these are the distributions a study imported here
# (`python -X importtime -m hpo.study ...`) that the list lacks, plus the two above.
#
# Nothing can be downloaded there, and the whole tree that travels must stay under 64 MiB.
# bitsandbytes' wheel is 41 MiB, almost all of it native libraries for every CUDA version:
# only its CPU library and CUDA 13.0's (the image's torch is 2.11+cu130) are kept. Left out
# on purpose, though mlflow-skinny or google-auth declare them: gitpython (MLflow's source
# tags, imported lazily), uvicorn (the MLflow server), pyasn1-modules (service accounts).
#
#     scripts/gpu_wheels.sh [--check]
#
# --check: in a fresh CPython 3.12 venv holding only the image's packages that these wheels
# declare (pip-installed from the registry here; torch and triton left out), install the
# wheels as the lease's command does and round-trip an Optuna and an MLflow SQLite store.
# PYTHON312 names that interpreter (default: pyenv's 3.12, else python3.12).
#
# .whl/ is ignored by git (.gitignore): it travels with the `run` call's `carry: [".whl"]`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.whl
LIMIT_MIB=64
PYTHON=${PYTHON:-.venv/bin/python}
CHECK=scripts/gpu_wheels_check.py

# Pinned to what this project's tests run with (FACTS.md), so the device runs the same code.
WHEELS=(
  optuna==5.0.0 colorlog==6.12.0
  SQLAlchemy==2.1.9 alembic==1.20.1 Mako==1.4.3
  mlflow-skinny==3.17.2 mlflow-tracing==3.17.2
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2
  opentelemetry-semantic-conventions==0.66b2
  fastapi==0.165.0 starlette==1.10.0 sqlparse==0.6.1 cachetools==7.3.3
  databricks-sdk==0.162.0 google-auth==2.63.0 importlib_metadata==9.1.0
  cryptography==50.0.2 cffi==2.1.1 pycparser==2.23 httpx2==2.16.2 httpcore2==2.16.2
  truststore==0.10.5 python-dotenv==1.2.1
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
  bitsandbytes==0.50.2
  liger-kernel==0.8.5
)

mkdir -p "$OUT"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$OUT" "${WHEELS[@]}"

# bitsandbytes: drop every native library but the CPU one and CUDA 13.0's.
for wheel in "$OUT"/bitsandbytes-*.whl; do
  drop=$(unzip -Z1 "$wheel" | grep -E '\.so$' | grep -vE 'libbitsandbytes_(cpu|cuda130)\.so$' || true)
  if [ -n "$drop" ]; then
    # shellcheck disable=SC2086
    zip -q -d "$wheel" $drop
  fi
done

# One version of each distribution: two stop the whole install there.
dupes=$(ls "$OUT" | sed -E 's/-[0-9].*//' | tr 'A-Z_' 'a-z-' | sort | uniq -d)
if [ -n "$dupes" ]; then
  echo "more than one version in $OUT of: $dupes" >&2
  exit 1
fi

# What travels: tracked and untracked-not-ignored files (shared/ too), plus the carried .whl.
wheels_bytes=$(du -cb "$OUT"/*.whl | tail -1 | cut -f1)
tree_bytes=$(git ls-files -z --cached --others --exclude-standard \
  | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
total=$((wheels_bytes + tree_bytes))
awk -v w="$wheels_bytes" -v t="$tree_bytes" -v n="$(ls "$OUT"/*.whl | wc -l)" -v l="$LIMIT_MIB" \
  'BEGIN {m = 1048576; printf "wheels %.1f MiB (%d files), tree %.1f MiB, together %.1f MiB of %d\n", w / m, n, t / m, (w + t) / m, l}'
if [ "$total" -ge $((LIMIT_MIB * 1048576)) ]; then
  echo "over the $LIMIT_MIB MiB a device call carries" >&2
  exit 1
fi

if [ "${1:-}" = "--check" ]; then
  # pyenv's shim answers `command -v` even where 3.12 is not the active version: its own
  # interpreter first.
  py312=${PYTHON312:-$( (ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null \
    || command -v python3.12) | tail -1)}
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  "$py312" -m venv "$scratch/venv"
  # shellcheck disable=SC2046
  "$scratch/venv/bin/python" -m pip install -q $("$PYTHON" "$CHECK" image-deps "$OUT")
  "$scratch/venv/bin/python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$scratch/site" "$OUT"/*.whl
  PYTHONPATH="$scratch/site" "$scratch/venv/bin/python" "$CHECK" round-trip "$scratch/site"
fi
