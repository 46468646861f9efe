# `make demo` and `make test` do all their own set-up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# torch's CPU wheel may lie on disk; pip then takes it instead of a multi-GB CUDA build.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: setup services demo test lint typecheck docs pytest bench ui clean

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

# PostgreSQL binaries for the multi-worker tests (the tests start their own server) and
# Chromium for the report's rendering test.
services:
	@bash scripts/ensure-postgres.sh
	@bash scripts/ensure-chromium.sh

# One process per core (at most 4, tests/conftest.py), a test file's tests in one of them (its
# module's servers start once); `make pytest PYTEST_ARGS=-n0` runs them in this process. The
# slowest tests are listed at the end, so a CI log shows where the suite's time goes.
PYTEST_ARGS ?= -n auto --dist loadfile --durations=25
pytest: $(STAMP) services
	$(PY) -m pytest $(PYTEST_ARGS)

# The documentation site, warnings as errors; its reference pages are generated from the code
# at every build (scripts/docs_reference.py), so a flag cannot go undocumented.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

test: lint typecheck docs pytest

# The MLflow UI over the studies' runs; `make ui UI_PORT=5001` for another port. Ctrl-C stops it.
UI_PORT ?= 5000
UI_STORE ?= sqlite:///$(CURDIR)/hpo-runs/mlflow.db
# One reader at a desk: one worker starts several times faster than MLflow's default four.
UI_WORKERS ?= 1
ui: $(STAMP)
	@$(PY) scripts/mlflow_ui_url.py --backend-store-uri '$(UI_STORE)' --host 127.0.0.1 --port $(UI_PORT)
	$(PY) -m mlflow server --backend-store-uri '$(UI_STORE)' --host 127.0.0.1 --port $(UI_PORT) \
		--workers $(UI_WORKERS)

bench: $(STAMP)
	$(PY) benchmarks/trainer_throughput.py --json hpo-runs/bench-trainer.json
	$(PY) benchmarks/tracking_overhead.py --json hpo-runs/bench-tracking.json

clean:
	rm -rf hpo-runs site .pytest_cache .mypy_cache .ruff_cache
