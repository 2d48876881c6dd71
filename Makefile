# Thin wrappers over scripts/: every target works on a fresh Debian 12 machine after `make setup`
# (demo and test run setup themselves).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
STACK ?= aws-dev

.PHONY: setup demo demo-clean up down status test check lint format pytest molecule e2e bench bench-peers plan bundle bake image lock clean

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

# The fast tier: lint and every test that needs no container (both cores), in minutes.
check: setup
	@scripts/test.sh check

lint: setup
	@scripts/test.sh lint

# Rewrite the Python files as `make lint` wants them (ruff format, then ruff's fixable lint fixes):
# `make lint` only checks, this target writes.
format: setup
	@scripts/test.sh format

pytest: setup
	@scripts/test.sh pytest

molecule: setup
	@scripts/test.sh molecule

e2e: setup
	@scripts/test.sh e2e

# The runtime's numbers on this machine (torchfleet-bench --help lists the other benchmarks).
bench: setup
	@$(PY) -m torchfleet_bench runtime

# Side by side with Mosec, LitServe and TorchServe: optional peers, each pinned into its own venv
# under .cache/peers/ (setup and test never install them). Options: PEERS_ARGS="--models demo".
bench-peers: setup
	@benchmarks/peers/run.sh $(PEERS_ARGS)

# The plan under Pulumi's mock engine (nothing created, no Pulumi CLI); with the cloud's credentials
# present it reads the region's prices from the price API (TORCHFLEET_PRICES=offline: never).
plan: setup
	@$(PY) -m infra.plan $(STACK)

# The node bundle of a stack (what its nodes fetch and run): path, sha256, object key, version.
bundle: setup
	@$(PY) -m infra.bundle $(STACK)

# The runtime container image (runtime/Containerfile) with the matrix's default profile on NVIDIA's
# CUDA base. Without a registry: make image BASE=localhost/torchfleet-bookworm:latest PROFILE=cpu
# WHEELHOUSE=.cache/wheelhouse-cp311. Optional: TAG, MODEL (a directory to bake), CA_CERTS, INDEX_URL.
image: setup
	@$(PY) scripts/build_runtime_image.py $(if $(PROFILE),--profile '$(PROFILE)') $(if $(BASE),--base '$(BASE)') \
	  $(if $(WHEELHOUSE),--wheelhouse '$(WHEELHOUSE)') $(if $(TAG),--tag '$(TAG)') $(if $(MODEL),--model '$(MODEL)') \
	  $(if $(CA_CERTS),--extra-ca-certs $(CA_CERTS)) $(if $(INDEX_URL),--index-url '$(INDEX_URL)') >/dev/null

# Bake the stack's bundle into an image (AWS: EC2 Image Builder during `pulumi up`) that the
# group then launches: the offline plan of it first, then the real run (Pulumi CLI needed).
# `pulumi up --config` writes torchfleet:boot: bake into Pulumi.$(STACK).yaml (commit or revert it).
bake: setup
	@$(PY) -m infra.plan $(STACK) --boot bake
	@command -v pulumi >/dev/null || { echo "make bake: no Pulumi CLI here; the plan above is what 'pulumi up --stack $(STACK) --config torchfleet:boot=bake' registers"; exit 1; }
	pulumi up --stack $(STACK) --config torchfleet:boot=bake

# Re-pin every transitive dependency after changing requirements/*.txt.
lock: setup
	@$(PY) -m pip freeze --exclude-editable | grep -v '^torchfleet' > requirements/constraints.txt
	@echo "wrote requirements/constraints.txt"

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
