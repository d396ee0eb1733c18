# gpufleet developer targets. `make test` installs everything the tests need, then runs them.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install test lint typecheck check sysdeps clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch: the CPU build (2.13.0) lies on disk on these machines; pinning it keeps pip from
# fetching a multi-GB CUDA build. Only the gloo collective test and the torch engine use it.
install: $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[all]'

# Debian packages the tests drive for real: Slurm + munge (scheduler tests), Prometheus and
# promtool (exporter tests), Alertmanager and amtool (alert routing tests), PostgreSQL (storage
# tests), Chromium (dashboard tests).
SYSDEPS ?= slurmctld slurmd slurm-client munge prometheus prometheus-alertmanager postgresql chromium
sysdeps:
	./scripts/install-sysdeps.sh $(SYSDEPS)

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: install
	$(BIN)/mypy

# Most tests wait on real processes (controllers, agents, daemons), not on the CPU: three
# workers on a 2-core machine take about half the time of one. Each test file stays on one
# worker (`--dist loadfile`: module fixtures and test order as in a serial run). TEST_WORKERS=0
# runs serially. Tests marked `serial` judge wall-clock timing (loopback bandwidth, a controller
# restart within a lease, the process chaos rounds with 3 s leases, the dashboard's 5 s fault
# display): they run afterwards, alone, since three workers on two cores can slow a process start
# several-fold (the chaos rounds passed alone and timed out under the parallel phase).
TEST_WORKERS ?= 3

test: install sysdeps
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not serial"
	$(BIN)/pytest -q -m serial

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
