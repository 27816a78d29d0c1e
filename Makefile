# Each target sets up .venv on its own; a second run takes seconds (stamp files).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test bench check setup clean test-gpu bench-gpu

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.stamp-[0-9]*; touch $@

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/gfaas demo

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

bench: $(STAMP)
	$(BIN)/gfaas bench dataplane

# GPU tier (needs a CUDA GPU; installs the gpu extra, i.e. CuPy): the CUDA backend's tests, then
# the GPU rows of the data-plane benchmark and the h100-x1 calibration drawn from them.
test-gpu: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,gpu]'
	$(BIN)/python -m pytest -q -rs tests/gpu tests/integration/test_device_objects.py

bench-gpu: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,gpu]'
	$(BIN)/gfaas bench dataplane --gpu --systems none --out benchmarks/results/dataplane-gpu.json
	$(BIN)/python benchmarks/calibrate_h100.py benchmarks/results/dataplane-gpu.json

check: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
