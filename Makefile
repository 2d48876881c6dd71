# Thin wrappers over scripts/: every target works on a fresh Debian 12 machine after `make setup`
# (demo and test run setup themselves).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
STACK ?= aws-dev

.PHONY: setup demo test lint pytest molecule bench plan bake lock clean

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

# Bake the stack's bundle into an image (AWS: EC2 Image Builder during `pulumi up`) that the
# group then launches: the offline plan of it first, then the real run (Pulumi CLI needed).
bake: setup
	@$(PY) -m infra.plan $(STACK) --boot bake
	@command -v pulumi >/dev/null || { echo "make bake: no Pulumi CLI here; the plan above is 	what 'pulumi up --stack $(STACK) --config torchfleet:boot=bake' registers"; exit 1; }
	pulumi up --stack $(STACK) --config torchfleet:boot=bake

# Re-pin every transitive dependency after changing requirements/*.txt.
lock: setup
	@$(PY) -m pip freeze --exclude-editable | grep -v '^torchfleet' > requirements/constraints.txt
	@echo "wrote requirements/constraints.txt"

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
