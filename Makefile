# The two commands of README.md: `make run` and `make test`. Both build .venv from pyproject.toml alone.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
HOST ?= 127.0.0.1
PORT ?= 8080
# Packages the type checker covers (pyproject.toml's [tool.mypy] has its settings).
TYPED_PACKAGES := rlctl

# Third-party MCP clients that cannot share .venv (tests/clients/plan.py says why), each in its own environment
# built from its lock (every package pinned, installed without resolving): tests/tools/test_clients.py runs them.
CLIENTS_VENV := .venv-clients
CLIENTS_LOCK := tests/clients/requirements.lock
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed-$(shell cat $(CLIENTS_LOCK) | cksum | cut -d' ' -f1)
AGENTS_VENV := .venv-agents
AGENTS_LOCK := tests/clients/agents.lock
AGENTS_STAMP := $(AGENTS_VENV)/.installed-$(shell cat $(AGENTS_LOCK) | cksum | cut -d' ' -f1)

# The SkyRL lane (docs/SKYRL.md): SkyRL's Tinker-compatible server in its own Python 3.12 environment.
SKYRL_PYTHON ?= $(shell python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null || \
	PYENV_VERSION=$$(pyenv versions --bare 2>/dev/null | grep '^3\.12' | tail -1) \
	python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null)
SKYRL_VENV := .venv-skyrl
SKYRL_LOCK := tests_skyrl/requirements.lock
SKYRL_STAMP := $(SKYRL_VENV)/.installed-$(shell cat $(SKYRL_LOCK) | cksum | cut -d' ' -f1)

.PHONY: install install-clients install-skyrl run test test-skyrl lint typecheck format clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/rlctl db upgrade
	$(BIN)/rlctl serve --host $(HOST) --port $(PORT)

# Two workers: most of the suite's time is spent waiting on processes it started, not on its own CPU.
TEST_WORKERS ?= 2

# One side environment of third-party clients from its lock: $(call side_venv,VENV,LOCK,STAMP,IMPORT).
define side_venv
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --no-deps -r $(2)
	$(1)/bin/python -c 'import $(4)'
	rm -f $(1)/.installed-*
	touch $(3)
endef

$(CLIENTS_STAMP): $(CLIENTS_LOCK)
	$(call side_venv,$(CLIENTS_VENV),$(CLIENTS_LOCK),$(CLIENTS_STAMP),mcp.client.streamable_http)

$(AGENTS_STAMP): $(AGENTS_LOCK)
	$(call side_venv,$(AGENTS_VENV),$(AGENTS_LOCK),$(AGENTS_STAMP),agents.mcp)

install-clients: $(CLIENTS_STAMP) $(AGENTS_STAMP)

# The slowest tests are listed at the end of the run (what a slow machine's run needs to be read).
test: install lint install-clients
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --durations=15

$(SKYRL_STAMP): $(SKYRL_LOCK)
	@test -n "$(SKYRL_PYTHON)" || { echo "SkyRL needs Python 3.12: put python3.12 on PATH or set SKYRL_PYTHON"; exit 1; }
	test -x $(SKYRL_VENV)/bin/python || $(SKYRL_PYTHON) -m venv $(SKYRL_VENV)
	$(SKYRL_VENV)/bin/python -m pip install --quiet --no-cache-dir --no-deps -r $(SKYRL_LOCK)
	$(SKYRL_VENV)/bin/python -c 'import skyrl.tinker.api, skyrl.backends.jax'
	rm -f $(SKYRL_VENV)/.installed-*
	touch $(SKYRL_STAMP)

install-skyrl: $(SKYRL_STAMP)

# Not part of `make test` (a 6 GB environment and minutes of CPU): train, save, sample and resume through the
# SDK, the trainer alone with a resume, and a whole echo run through the service, against SkyRL on the CPU.
test-skyrl: install install-skyrl
	RLCTL_SKYRL_VENV=$(SKYRL_VENV) $(BIN)/python -m pytest tests_skyrl -v

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MAKE) --no-print-directory typecheck

typecheck: install
	$(BIN)/mypy $(TYPED_PACKAGES)

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) $(CLIENTS_VENV) $(AGENTS_VENV) $(SKYRL_VENV) .pytest_cache .ruff_cache .mypy_cache
