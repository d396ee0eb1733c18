# gpufleet developer targets. `make test` installs everything the tests need, then runs them.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install test lint typecheck check sysdeps clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e '.[all]'

sysdeps:
	./scripts/install-sysdeps.sh

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: install
	$(BIN)/mypy

test: install sysdeps
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
