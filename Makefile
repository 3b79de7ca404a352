# turnrl: every target sets up what it needs in .venv (idempotent), so
# `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: setup demo test test-slow lint bench bench-rollout grouping clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned exactly: an unpinned/ranged torch pulls a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[train,serve,textarena,ray,dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/turnrl train --config examples/calculator.toml
	$(VENV)/bin/turnrl audit runs/calculator/rollouts/step-000060.jsonl

test: setup
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples

bench: setup
	$(PY) benchmarks/credit.py

bench-rollout: setup
	$(PY) benchmarks/rollout.py

grouping: setup
	$(PY) examples/grouping/run.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .hypothesis
