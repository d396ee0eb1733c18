# gpufleet developer targets. `make test` installs everything the tests need, then runs them.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install test test-fast guard lint typecheck check sysdeps clean coverage

# Bytecode: the development and CI machines set PYTHONDONTWRITEBYTECODE, so every `python -m
# gpufleet` a test starts compiled gpufleet from source again (~0.3 s of CPU a start, hundreds
# of starts a run). The tests and the guard run with bytecode, as a user's install does;
# __pycache__ is ignored by git.
unexport PYTHONDONTWRITEBYTECODE
COMPILE := $(BIN)/python -m compileall -q src/gpufleet

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch: the CPU build (2.13.0) lies on disk on these machines (/opt/wheels, pip's find-links
# here); pinning it keeps the installer from fetching a multi-GB CUDA build. Only the gloo
# collective test and the torch engine use it. The packages go in with uv (from PyPI), which
# installs the same set in ~25 s where pip took ~65 s on a quiet CI machine (157 s against 45 s
# side by side at load 15, 2026-12-07); if uv cannot be had or fails, pip does it as before.
# A stamp, so `make test-fast` does not reinstall each time: installs again when pyproject changes.
FIND_LINKS := $(if $(wildcard /opt/wheels/*.whl),--find-links /opt/wheels)
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	( $(BIN)/pip install -q uv && \
	  $(BIN)/uv pip install -q --python $(BIN)/python $(FIND_LINKS) torch==2.13.0 -e '.[all]' ) || \
	( echo "uv failed: installing with pip"; $(BIN)/pip install -q --upgrade pip && \
	  $(BIN)/pip install -q torch==2.13.0 && $(BIN)/pip install -q -e '.[all]' )
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

# Most process tests wait on real processes (controllers, agents, daemons) as much as on the CPU:
# four workers on a 2-core machine keep both cores busy (617 s against 662 s with three, one
# phase, 2026-12-06). Each test file stays on one worker (`--dist loadfile`: module fixtures and
# test order as in a serial run), longest files first (tests/file_order.py; `--no-loadscope-reorder`,
# since xdist >= 3.7 otherwise sorts the files by their number of tests, which sent the one-test
# chaos files, the longest, to the end of the run). TEST_WORKERS=0 runs
# serially. There is no serial phase any more: the suites that had one (fencing, the process and
# HA chaos rounds, the campaign kill -9 rounds, loopback bandwidth, the 64-agent dashboard) judge
# no fixed wall-clock bound, their protocol times follow GPUFLEET_TEST_TIME_SCALE, and the
# controller counts its own starved spans as deaf time, not as its nodes' silence; alone
# afterwards they cost ~6 of the suite's ~13 minutes, mostly waiting on leases with idle cores.
TEST_WORKERS ?= 4

# Each phase prints the clock first, so a CI log says where its minutes went. The type check
# (~40 s of one core on a clean clone, no cache) runs alongside the tests' first minutes, which
# are the longest process files, waiting on leases more than computing; its verdict and output
# come after the tests', and either failing fails the target.
test: install sysdeps
	@date +"== %T lint"
	$(BIN)/ruff check src tests benchmarks
	$(COMPILE)
	@date +"== %T tests, the type check alongside"
	@$(BIN)/mypy > $(VENV)/mypy.log 2>&1 & types=$$!; \
	GPUFLEET_HYPOTHESIS_PROFILE=ci $(PYTEST) -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=40; \
	tests=$$?; wait $$types; typed=$$?; \
	echo "== mypy (exit $$typed)"; cat $(VENV)/mypy.log; \
	test $$tests -eq 0 -a $$typed -eq 0
	@date +"== %T figures guard"
	$(BIN)/python benchmarks/guard.py
	@date +"== %T done"

# Line coverage of src over the whole suite, the processes it starts included (controllers,
# agents, CLI runs: coverage's subprocess patch); the protocol times doubled for coverage's
# own cost. Per-file table in coverage.txt, the data in .coverage.
coverage: install sysdeps
	rm -f .coverage .coverage.*
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 COVERAGE_FILE=$(CURDIR)/.coverage GPUFLEET_TEST_TIME_SCALE=2 \
		GPUFLEET_HYPOTHESIS_PROFILE=ci \
		$(BIN)/coverage run -m pytest -p xdist.plugin -p pytest_timeout -q -n $(TEST_WORKERS) \
		--dist loadfile --no-loadscope-reorder -p no:cacheprovider
	COVERAGE_FILE=$(CURDIR)/.coverage $(BIN)/coverage combine -q
	COVERAGE_FILE=$(CURDIR)/.coverage $(BIN)/coverage report > coverage.txt; tail -n 1 coverage.txt

# The figures guard alone: CPU time of the headline figures against benchmarks/guard_budgets.json.
guard: install
	$(BIN)/python benchmarks/guard.py

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
