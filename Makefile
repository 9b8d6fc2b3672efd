# The few verbs people type. Everything installs from this repository's own files.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest bench postgres clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## demo: set up and run a short realistic scenario on SQLite
demo: $(STAMP)
	bash scripts/demo.sh

## test: lint, type-check and run the whole test suite
test: $(STAMP) lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy catalog events scheduler llmgw agent bench

pytest: $(STAMP)
	$(BIN)/pytest -n 2 -q

## bench: print the benchmark tables (see BENCHMARKS.md)
bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m bench

## postgres: start the local PostgreSQL server if it is down
postgres:
	bash scripts/start-postgres.sh

clean:
	rm -rf $(VENV) demo .pytest_cache .mypy_cache .ruff_cache .hypothesis
