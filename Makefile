# harness — the two commands of the quick start are `make demo` and `make test`.
# Everything else is set up on the way: a virtualenv, the Docker engine, the images.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HARNESS := $(VENV)/bin/harness
SUITE ?= refunds
PROFILE ?=
TRIALS ?=
K ?=
REQUIRE ?= pass^4>=0.9
PYTEST_ARGS ?=

.PHONY: help setup venv engine engine-stop images suite-images browser compose postgres demo test test-fast test-ray test-cgroup2 lint bench schemas eval gate clean

help:
	@echo "make demo      set up (venv, engine, images) and run the refunds suite"
	@echo "make test      set up and run the test suite (real containers), all but test-ray and test-cgroup2"
	@echo "make test-ray  the Ray executor on multi-node clusters started on this machine (~2.5 min)"
	@echo "make test-cgroup2   the cgroup v2 checks in a Debian guest under QEMU (root; ~18 min cold, ~9 cached, emulated)"
	@echo "make bench     overhead and throughput ratios against baselines measured in the same run"
	@echo "make eval SUITE=refunds [PROFILE=tight] [TRIALS=8] [K=1,2,4,8]   run a suite"
	@echo "make gate SUITE=refunds REQUIRE='pass^4>=0.9' [TRIALS=4 K=1,2,4]  run a suite, then gate on it (non-zero exit if unmet)"
	@echo "make engine    make sure a Docker engine answers (installs docker.io, starts dockerd; root)"
	@echo "make images    build harness/base (offline, mmdebstrap), harness/sandbox and suite images"

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

engine:
	@bash docker/engine.sh

engine-stop:
	@bash docker/engine.sh stop

images: venv engine
	@$(HARNESS) images build

# Debian's chromium for the HTML report's headless-browser test (root installs it)
browser:
	@command -v chromium >/dev/null || { echo "installing chromium (apt-get)..."; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }; }

# Debian's postgresql server binaries for the Postgres store test (the test starts its own
# private cluster on a unix socket and stops it)
postgres:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { echo "installing postgresql (apt-get)..."; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null; }; }

# Debian's docker-compose, the baseline of the throughput benchmark
compose:
	@command -v docker-compose >/dev/null || { echo "installing docker-compose (apt-get)..."; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/dev/null; }; }

setup: images

demo: setup
	$(HARNESS) run --suite refunds

# every test but the multi-node Ray cluster ones (test-ray) and the cgroup v2 guest
# (test-cgroup2): slow targets of their own, each a step of .ci/run
test: setup browser postgres lint
	HARNESS_REQUIRE_DOCKER=1 $(PY) -m pytest -q -m "not ray_cluster" $(PYTEST_ARGS)

# Ray executor on real multi-node clusters started on this machine (node loss, a killed
# worker or driver, a silent node): about 2.5 min
test-ray: setup
	HARNESS_REQUIRE_DOCKER=1 $(PY) -m pytest -q -m ray_cluster $(PYTEST_ARGS)

test-fast: venv lint
	$(PY) -m pytest -q -m "not docker" $(PYTEST_ARGS)

# The cgroup v2 checks on a real v2 kernel (this machine and CI boot v1): a Debian bookworm
# guest under QEMU, built offline and cached by its inputs (tests/guest/cgroup2.py says how).
# The host's images are saved into it, so it needs the engine and `images` first.
test-cgroup2: venv
	@$(PY) tests/guest/cgroup2.py check
	@$(MAKE) --no-print-directory images
	$(PY) tests/guest/cgroup2.py run

# the architecture (pyproject.toml [tool.importlinter]): layers, and who may import docker,
# sqlalchemy and the CLI libraries
lint: venv
	@$(VENV)/bin/lint-imports --no-cache

bench: setup compose
	$(PY) -m harness.cli.bench --readme README.md

schemas: venv
	$(PY) -m harness.model.schemas

RUN_ARGS = --suite $(SUITE) $(if $(PROFILE),--profile $(PROFILE)) $(if $(TRIALS),--trials $(TRIALS)) $(if $(K),--k $(K))

# the suite's own images (a suite directory of yours: `make eval SUITE=./mine`); built-in
# suites are already built by `images`, so this is a no-op for them (inputs unchanged)
suite-images: setup
	@$(HARNESS) images build --suite $(SUITE)

eval: suite-images
	$(HARNESS) run $(RUN_ARGS)

# one command: a requirement this run cannot judge (k above the trials) is refused before it
# runs; after it, exit 1 when one is unmet (3 when slots ended unmeasured)
gate: suite-images
	@test -n "$(REQUIRE)" || { echo "make gate: give REQUIRE='pass^4>=0.9' (several separated by spaces)" >&2; exit 2; }
	$(HARNESS) run $(RUN_ARGS) $(foreach r,$(REQUIRE),--require '$(r)')

clean:
	rm -rf $(VENV) .pytest_cache *.egg-info
