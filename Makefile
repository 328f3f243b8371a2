# The README's commands. `make demo` and `make test` each set up .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch 2.13.0's CPU wheel lies in /opt/wheels on this workplace's machines; elsewhere pip finds it
# on its own index.
WHEELS := $(wildcard /opt/wheels)
PIP_FLAGS := $(if $(WHEELS),--find-links $(WHEELS),)

.PHONY: demo test test-full lint format seeds clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(PIP_FLAGS) -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)  ## train on the embedded BBC corpus, test, write reports/bbc/
	$(BIN)/docclass fit --config configs/bbc.yaml

test: $(STAMP)  ## the fast suite (CI)
	$(BIN)/python -m pytest -m "not slow"

test-full: $(STAMP)  ## every test, slow ones included
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check docclass tests scripts
	$(BIN)/ruff format --check docclass tests scripts

format: $(STAMP)
	$(BIN)/ruff format docclass tests scripts
	$(BIN)/ruff check --fix docclass tests scripts

seeds: $(STAMP)  ## the default config over three seeds: the spread the README quotes
	$(BIN)/python scripts/seeds.py configs/bbc.yaml --seeds 0 1 2 --out reports/seeds/bbc \
		--summary reports/bbc-seeds.json

clean:
	rm -rf $(VENV) reports/tiny reports/bbc
