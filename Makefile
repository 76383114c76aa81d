# Every target creates .venv itself; nothing is installed outside it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-core
DEVSTAMP := $(VENV)/.installed-dev
VALSTAMP := $(VENV)/.installed-validators

.PHONY: plan test lint validate bench clean setup gpu-check schema fuzz mutate launch-doc

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $@

# Tests need torch (pinned exactly: a range pulls a multi-GB CUDA build) and the dev tools.
$(DEVSTAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench,dev,plots]'
	touch $@

# The frameworks' own validators that install on CPU (tests/test_framework_validators.py): DeepSpeed without its
# kernels (DS_BUILD_OPS=0, pure Python; built against the installed torch, hence --no-build-isolation), and
# megatron-core's configs (its only runtime needs are torch, numpy and packaging: --no-deps keeps Transformer Engine
# and the rest of its extras out), and torchtitan 0.3.0's source (--no-deps: the tests load its config dataclasses
# and pipeline-split functions from the files, without the Hugging Face datasets stack its package imports), with
# spmd_types 0.2.3 (pure Python, no dependencies: torchtitan's configs build its types), so that torchtitan's own
# Trainer.Config / ParallelDims validation runs with only the heavy, never-called imports stubbed.
$(VALSTAMP): $(DEVSTAMP)
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q --no-build-isolation 'deepspeed==0.19.8'
	$(BIN)/python -m pip install -q --no-deps 'megatron-core==0.16.1' 'torchtitan==0.3.0' 'spmd_types==0.2.3'
	touch $@

setup: $(DEVSTAMP)

plan: $(STAMP)
	$(BIN)/planner plan --cluster dgx-a100-80gb --nodes 280 --model mt-nlg-530b \
		--global-batch-size 1920 --seq-len 2048

test: $(VALSTAMP)
	$(BIN)/python -m pytest

# The fuzz suite alone (tests/test_fuzz.py: >= 10,000 hypothesis cases over every reader and command; `make test`
# runs it too). FUZZ_SCALE=10 make fuzz runs ten times as many.
FUZZ_SCALE ?= 1
fuzz: $(VALSTAMP)
	FUZZ_SCALE=$(FUZZ_SCALE) $(BIN)/python -m pytest tests/test_fuzz.py -p no:cacheprovider

# Mutation testing (not in CI; docs/mutation.md): mutmut mutates the files [tool.mutmut] names in pyproject.toml and
# runs its fast in-process test subset against each mutant, one worker at the lowest CPU priority. Narrow it with
# MUTANTS (mutant-name globs), e.g. `make mutate MUTANTS='cost_models.stage.* planner.refine.*'`. Results stay in
# mutants/ (re-runs only test what changed); `.venv/bin/mutmut results` lists the survivors.
MUTANTS ?=
mutate: $(DEVSTAMP)
	nice -n 19 $(BIN)/mutmut run --max-children 1 $(foreach m,$(MUTANTS),"$(m)")
	$(BIN)/python tests/mutation_score.py $(foreach m,$(MUTANTS),"$(m)")

# ruff (incl. C901, max complexity 12) and mypy at the settings in pyproject.toml ([tool.mypy]: --strict flags on
# cost_models/, default checks elsewhere): both must report 0 errors.
lint: $(DEVSTAMP)
	$(BIN)/ruff check planner cost_models cluster_specs tests
	$(BIN)/mypy

# The published JSON Schemas are generated from planner/contract.py (tests/test_contract.py checks they are current)
SCHEMAS := plan estimate check bench check-batch compare scaling error clusters cluster calibration models model \
	validation version
schema: $(STAMP)
	for s in $(SCHEMAS); do $(BIN)/planner schema $$s > docs/schema/$$s.schema.json || exit 1; done

# issue #11's closing tables (exports x validators x round trip; real-config verdicts), from the tests' own data
launch-doc: $(VALSTAMP)
	PYTHONPATH=. $(BIN)/python tests/launch_tables.py > docs/launch.md

validate: $(STAMP)
	$(BIN)/planner validate --runs ../shared/validation/published_runs.json -o docs/validation.md --write-tables

bench: $(STAMP)
	$(BIN)/python -m planner.speed_bench

# The GPU check (issue #12), for a machine with a GPU (the device tool's H200), in under 5 minutes: calibrate, then
# single-GPU cases (8B under each recompute policy, 70B/175B layer proxies, ZeRO-0 and FSDP2 recipes), predicted vs
# measured into docs/validation-gpu.md. Plain python3 (torch, typer, rich, PyYAML, pydantic): no venv needed.
GPU_OUT ?= gpu-check
gpu-check:
	PYTHONPATH=$(CURDIR):$$PYTHONPATH $(PYTHON) -m planner.bench.gpu_check --out $(GPU_OUT) --doc docs/validation-gpu.md

clean:
	rm -rf $(VENV) build *.egg-info
