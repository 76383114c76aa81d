# Every target creates .venv itself; nothing is installed outside it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-core
DEVSTAMP := $(VENV)/.installed-dev

.PHONY: plan test lint validate bench clean setup gpu-check schema

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

# The published JSON Schemas are generated from planner/contract.py (tests/test_contract.py checks they are current)
SCHEMAS := plan estimate check bench
schema: $(STAMP)
	for s in $(SCHEMAS); do $(BIN)/planner schema $$s > docs/schema/$$s.schema.json || exit 1; done

validate: $(STAMP)
	$(BIN)/planner validate --runs ../shared/validation/published_runs.json -o docs/validation.md

bench: $(STAMP)
	$(BIN)/python -m planner.speed_bench

# The GPU check of issue #6, as one script for a machine with a GPU (the device tool's H200): calibrate the GPU,
# then the memory model against CUDA's measured peak for a multi-layer proxy under each recompute policy (ZeRO 0).
GPU_OUT ?= gpu-check
gpu-check: $(DEVSTAMP)
	mkdir -p $(GPU_OUT)
	$(BIN)/planner calibrate --nproc 1 --gpu H200 --model llama3-8b --seq-len 4096 -o $(GPU_OUT)/h200.yaml
	for rc in none selective full; do \
	  $(BIN)/planner bench -c $(GPU_OUT)/h200.yaml -m llama3-8b --layout "dp=1,mbs=1,recompute=$$rc" \
	    --layers-per-stage 8 --seq-len 4096 --dtype bfloat16 --nproc 1 --steps 5 --warmup 2 \
	    --json -o $(GPU_OUT)/bench-$$rc.json > /dev/null || exit 1; \
	done

clean:
	rm -rf $(VENV) build *.egg-info
