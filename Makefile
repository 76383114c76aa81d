# Every target creates .venv itself; nothing is installed outside it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-core
DEVSTAMP := $(VENV)/.installed-dev

.PHONY: plan test lint validate bench clean setup

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $@

# Tests need torch (pinned exactly: a range pulls a multi-GB CUDA build) and the dev tools.
$(DEVSTAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench,dev]'
	touch $@

setup: $(DEVSTAMP)

plan: $(STAMP)
	$(BIN)/planner plan --cluster dgx-a100-80gb --nodes 280 --model mt-nlg-530b \
		--global-batch-size 1920 --seq-len 2048

test: $(DEVSTAMP)
	$(BIN)/python -m pytest

lint: $(DEVSTAMP)
	$(BIN)/ruff check planner cost_models cluster_specs tests

validate: $(STAMP)
	$(BIN)/planner validate --runs ../shared/validation/published_runs.json -o docs/validation.md

bench: $(STAMP)
	$(BIN)/python -m planner.speed_bench

clean:
	rm -rf $(VENV) build *.egg-info
