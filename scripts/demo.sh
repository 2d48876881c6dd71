#!/usr/bin/env bash
# `make demo`: the runtime serving its demo model on this machine, then the offline plan.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/demo.py
