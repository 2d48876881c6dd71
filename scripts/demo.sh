#!/usr/bin/env bash
# `make demo`: `torchfleet up` on this machine, with systemd containers as the stack's nodes
# (infra/deploy/demo.py). NODES=2 starts two. `scripts/demo.sh --clean` (make demo-clean)
# removes what it made. TORCHFLEET_DEMO_PREFIX (default torchfleet-demo-) names the containers.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/torchfleet demo "$@"
