# Thin wrappers over scripts/: every target works on a fresh Debian 12 machine after `make setup`
# (demo and test run setup themselves).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
STACK ?= aws-dev

.PHONY: setup demo test lint pytest molecule bench plan bundle lock clean

setup:
	@scripts/setup.sh

demo: setup
	@scripts/demo.sh

test: setup
	@scripts/test.sh

lint: setup
	@scripts/test.sh lint

pytest: setup
	@scripts/test.sh pytest

molecule: setup
	@scripts/test.sh molecule

bench: setup
	@$(PY) benchmarks/runtime_bench.py

plan: setup
	@$(PY) -m infra.plan $(STACK)

# The node bundle of a stack (what its nodes fetch and run): path, sha256, object key, version.
bundle: setup
	@$(PY) -m infra.bundle $(STACK)

# Re-pin every transitive dependency after changing requirements/*.txt.
lock: setup
	@$(PY) -m pip freeze --exclude-editable | grep -v '^torchfleet' > requirements/constraints.txt
	@echo "wrote requirements/constraints.txt"

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
