# Thin wrappers over scripts/: every target works on a fresh Debian 12 machine after `make setup`
# (demo and test run setup themselves).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
STACK ?= aws-dev

.PHONY: setup demo test lint pytest molecule bench bench-peers plan image lock clean

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

# Side by side with Mosec, LitServe and TorchServe: optional peers, each pinned into its own venv
# under .cache/peers/ (setup and test never install them). Options: PEERS_ARGS="--models demo".
bench-peers: setup
	@benchmarks/peers/run.sh $(PEERS_ARGS)

plan: setup
	@$(PY) -m infra.plan $(STACK)

# The runtime container image (runtime/Containerfile) with the matrix's default profile on NVIDIA's
# CUDA base. Without a registry: make image BASE=localhost/torchfleet-bookworm:latest PROFILE=cpu
# WHEELHOUSE=.cache/wheelhouse-cp311. Optional: TAG, MODEL (a directory to bake), CA_CERTS, INDEX_URL.
image: setup
	@$(PY) scripts/build_runtime_image.py $(if $(PROFILE),--profile '$(PROFILE)') $(if $(BASE),--base '$(BASE)') \
	  $(if $(WHEELHOUSE),--wheelhouse '$(WHEELHOUSE)') $(if $(TAG),--tag '$(TAG)') $(if $(MODEL),--model '$(MODEL)') \
	  $(if $(CA_CERTS),--extra-ca-certs $(CA_CERTS)) $(if $(INDEX_URL),--index-url '$(INDEX_URL)') >/dev/null

# Re-pin every transitive dependency after changing requirements/*.txt.
lock: setup
	@$(PY) -m pip freeze --exclude-editable | grep -v '^torchfleet' > requirements/constraints.txt
	@echo "wrote requirements/constraints.txt"

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
