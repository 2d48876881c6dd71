#!/usr/bin/env bash
# `make demo`: what torchfleet can show without a cloud account or a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "torchfleet demo: nothing to show yet beyond the toolchain; the runtime demo lands with issue #3."
