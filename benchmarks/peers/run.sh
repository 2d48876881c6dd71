#!/usr/bin/env bash
# `make bench-peers`: install the peers (each in its own venv, see install.sh), then run the
# side-by-side benchmark (torchfleet-bench peers) with the project's .venv. Arguments go to it, e.g.
#   benchmarks/peers/run.sh --models demo --repetitions 1 --duration 3
# PEERS_SERVERS (comma list) limits which peers are installed and run.
set -euo pipefail
cd "$(dirname "$0")/../.."
servers=${PEERS_SERVERS:-torchfleet,mosec,litserve,torchserve}
peers=()
for s in ${servers//,/ }; do [ "$s" = torchfleet ] || peers+=("$s"); done
if [ ${#peers[@]} -gt 0 ]; then benchmarks/peers/install.sh "${peers[@]}"; else benchmarks/peers/install.sh --tools; fi
exec .venv/bin/python -m torchfleet_bench peers --servers "$servers" "$@"
