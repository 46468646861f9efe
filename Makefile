# `make demo` and `make test` do all their own set-up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# torch's CPU wheel may lie on disk; pip then takes it instead of a multi-GB CUDA build.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: setup services demo test lint typecheck pytest bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(FIND_LINKS) -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m hpo.study

lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# PostgreSQL binaries for the multi-worker tests (the tests start their own server).
services:
	@bash scripts/ensure-postgres.sh

pytest: $(STAMP) services
	$(PY) -m pytest

test: lint typecheck pytest

bench: $(STAMP)
	$(PY) benchmarks/trainer_throughput.py --json hpo-runs/bench-trainer.json
	$(PY) benchmarks/tracking_overhead.py --json hpo-runs/bench-tracking.json

clean:
	rm -rf hpo-runs .pytest_cache .mypy_cache .ruff_cache
