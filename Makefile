# Developer entry points. `make dev` then `make test` is exactly what CI (.ci/run) runs.
# Everything Python goes into a virtual environment under the checkout ($(VENV)): Debian's and
# Ubuntu's system Python refuses `pip install` (PEP 668), and the user's own packages stay as they are.
SYSTEM_PYTHON ?= python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python
export CCACHE_BASEDIR := $(CURDIR)

.PHONY: dev system-deps install llama cuda-check build check test lint clean-build

dev: system-deps install llama        ## everything the tests need, from a fresh clone

system-deps:                          ## build tools, venv and the browser for the web UI test (Debian/Ubuntu, as root)
	@missing=""; for p in cmake ninja-build ccache xz-utils chromium; do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	$(SYSTEM_PYTHON) -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; \
	  else echo "run as root or install:$$missing" >&2; exit 1; fi; fi

# The venv with buun (editable) and the test dependencies; made again when pyproject.toml changes.
$(VENV)/.buun-installed: pyproject.toml
	test -x $(PYTHON) || $(SYSTEM_PYTHON) -m venv $(VENV)
	$(PYTHON) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.buun-installed      ## buun itself, editable, with the test dependencies, in $(VENV)

llama: install                        ## the pinned llama.cpp, patched, built for the CPU
	$(VENV)/bin/buun vendor
	$(VENV)/bin/buun patch
	$(VENV)/bin/buun build --cpu

# Compile-only check of the CUDA sources the series adds or changes, for sm_86 and sm_90: needs nvcc,
# no GPU, and the patched tree of `make llama` (it says so when the tree is not patched).
cuda-check: install                   ## compile the series' CUDA files for sm_86/sm_90 (nvcc, no GPU)
	$(PYTHON) scripts/cuda_compile_check.py --tree vendor/llama.cpp --arch 86,90 --jobs 2

build: llama

lint: install
	$(VENV)/bin/ruff check .

# The suite in two tiers (docs/development.md). `check` is the edit-test loop: lint and every test
# that starts no llama-server and builds nothing (conftest marks each test that uses the build's
# fixtures `slow`). `test` is the whole suite: `check`, then the slow tier; CI runs it. Each tier
# says how long it took. `check` runs its tests in CHECK_JOBS processes (pytest-xdist; 1 runs them
# in this one): they start no llama-server, so two processes on two cores do not starve each other.
CHECK_JOBS ?= 2
check: lint                           ## lint, then the tests that need no llama.cpp build (a few minutes)
	@start=$$(date +%s); $(PYTHON) -m pytest -q -m "not slow" $(if $(filter-out 1,$(CHECK_JOBS)),-n $(CHECK_JOBS)) \
	  --durations=5; rc=$$?; \
	  echo "tier check: $$(( $$(date +%s) - start )) s"; exit $$rc

# The slow tier runs in SLOW_JOBS processes, a test file to one process at a time (--dist loadfile:
# a module's shared servers stay in one), and with more than one every llama-server the tests start
# takes one thread (LLAMA_ARG_THREADS; a test's own -t wins): two servers of two threads on two
# cores wait for each other's threads at every op, two of one thread run side by side, and much of
# the tier only waits (supervisors, restarts, the fake Hub), which the other process fills.
SLOW_JOBS ?= 2
test: check                           ## the whole suite: `check`, then the tests that run the CPU build
	@start=$$(date +%s); $(if $(filter-out 1,$(SLOW_JOBS)),LLAMA_ARG_THREADS=1) $(PYTHON) -m pytest -q -m slow \
	  $(if $(filter-out 1,$(SLOW_JOBS)),-n $(SLOW_JOBS) --dist loadfile) --durations=15; rc=$$?; \
	  echo "tier slow: $$(( $$(date +%s) - start )) s"; exit $$rc

clean-build:
	rm -rf vendor/build
