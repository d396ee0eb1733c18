# gpufleet developer targets. `make test` installs everything the tests need, then runs them.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install test test-fast guard lint typecheck check sysdeps clean

# Bytecode: the development and CI machines set PYTHONDONTWRITEBYTECODE, so every `python -m
# gpufleet` a test starts compiled gpufleet from source again (~0.3 s of CPU a start, hundreds
# of starts a run). The tests and the guard run with bytecode, as a user's install does;
# __pycache__ is ignored by git.
unexport PYTHONDONTWRITEBYTECODE
COMPILE := $(BIN)/python -m compileall -q src/gpufleet

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch: the CPU build (2.13.0) lies on disk on these machines; pinning it keeps pip from
# fetching a multi-GB CUDA build. Only the gloo collective test and the torch engine use it.
# A stamp, so `make test-fast` does not run pip each time: installs again when pyproject changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[all]'
	touch $@

install: $(VENV)/.installed

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

# pytest with plugin auto-loading off: the installed plugins (schemathesis, hypothesis, anyio,
# ...) made every pytest process and xdist worker start ~5x slower (1.9 s against 0.36 s of
# CPU); the two the suite uses are named.
PYTEST := PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(BIN)/pytest -p xdist.plugin -p pytest_timeout

# The fast tier: every test not marked `process` or `browser` (tests/tiers.py fails an unmarked
# test that starts a process or listens on a socket), with Hypothesis's small `dev` profile.
FAST_WORKERS ?= 2
test-fast: install
	$(BIN)/ruff check src tests benchmarks
	$(COMPILE)
	GPUFLEET_HYPOTHESIS_PROFILE=dev $(PYTEST) -q -n $(FAST_WORKERS) -m "not process and not browser"

# Most tests wait on real processes (controllers, agents, daemons), not on the CPU: three
# workers on a 2-core machine take about half the time of one. Each test file stays on one
# worker (`--dist loadfile`: module fixtures and test order as in a serial run). TEST_WORKERS=0
# runs serially. Tests marked `serial` still need the machine to themselves (loopback bandwidth
# judged against peers, a controller restart within a lease, the process chaos rounds with 3 s
# leases): they run afterwards, alone, since three workers on two cores can slow a process start
# several-fold (the chaos rounds passed alone and timed out under the parallel phase). The
# dashboard's browser tests judge no seconds, but their 64 in-process agents go lost under the
# parallel phase's load and the circuit breaker then rightly refuses the fault's drain.
TEST_WORKERS ?= 3

# Each phase prints the clock first, so a CI log says where its minutes went.
test: install sysdeps
	@date +"== %T lint and types"
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(COMPILE)
	@date +"== %T parallel phase"
	GPUFLEET_HYPOTHESIS_PROFILE=ci $(PYTEST) -q -n $(TEST_WORKERS) --dist loadfile -m "not serial"
	@date +"== %T serial phase"
	GPUFLEET_HYPOTHESIS_PROFILE=ci $(PYTEST) -q -m serial
	@date +"== %T figures guard"
	$(BIN)/python benchmarks/guard.py
	@date +"== %T done"

# The figures guard alone: CPU time of the headline figures against benchmarks/guard_budgets.json.
guard: install
	$(BIN)/python benchmarks/guard.py

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
