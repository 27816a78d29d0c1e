# Each target sets up .venv on its own; a second run takes seconds (stamp files).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test bench check setup clean

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

check: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
