# Developer entry points. `make dev` then `make test` is exactly what CI (.ci/run) runs.
PYTHON ?= python3
export CCACHE_BASEDIR := $(CURDIR)

.PHONY: dev system-deps install llama build test lint clean-build

dev: system-deps install llama        ## everything the tests need, from a fresh clone

system-deps:                          ## build tools and the browser for the web UI test (Debian/Ubuntu, as root)
	@missing=""; for p in cmake ninja-build ccache xz-utils chromium; do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; \
	  else echo "run as root or install:$$missing" >&2; exit 1; fi; fi

install:                              ## buun itself, editable, with the test dependencies
	$(PYTHON) -m pip install -q -e '.[test]'

llama:                                ## the pinned llama.cpp, patched, built for the CPU
	buun vendor
	buun patch
	buun build --cpu

build: llama

lint:
	ruff check .

test: lint                            ## lint, then the whole test suite against the CPU build
	$(PYTHON) -m pytest -q

clean-build:
	rm -rf vendor/build
