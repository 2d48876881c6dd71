# Thin wrappers over scripts/: every target works on a fresh Debian 12 machine after `make setup`
# (demo and test run setup themselves).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
STACK ?= aws-dev

.PHONY: setup demo demo-clean up down status test lint pytest molecule e2e bench plan lock clean

setup:
	@scripts/setup.sh

# `up` on this machine: container nodes converged by the same stages (NODES=2 for two).
demo: setup
	@scripts/demo.sh

demo-clean: setup
	@scripts/demo.sh --clean

# One command per job (torchfleet --help lists the stages and exit codes).
up: setup
	@$(VENV)/bin/torchfleet up $(STACK)

down: setup
	@$(VENV)/bin/torchfleet down $(STACK) $(if $(YES),--yes)

status: setup
	@$(VENV)/bin/torchfleet status $(STACK)

test: setup
	@scripts/test.sh

lint: setup
	@scripts/test.sh lint

pytest: setup
	@scripts/test.sh pytest

molecule: setup
	@scripts/test.sh molecule

e2e: setup
	@scripts/test.sh e2e

bench: setup
	@$(PY) benchmarks/runtime_bench.py

plan: setup
	@$(PY) -m infra.plan $(STACK)

# Re-pin every transitive dependency after changing requirements/*.txt.
lock: setup
	@$(PY) -m pip freeze --exclude-editable | grep -v '^torchfleet' > requirements/constraints.txt
	@echo "wrote requirements/constraints.txt"

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
