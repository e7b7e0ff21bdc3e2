# The two commands of README.md: `make run` and `make test`. Both build .venv from pyproject.toml alone.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
HOST ?= 127.0.0.1
PORT ?= 8080
# Packages the type checker covers (pyproject.toml's [tool.mypy] has its settings).
TYPED_PACKAGES := service supervisor trainer trajectories

.PHONY: install run test lint typecheck format clean

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

test: install lint
	$(BIN)/python -m pytest

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
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
