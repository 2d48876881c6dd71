#!/usr/bin/env bash
# Every test suite, in order of speed: lint first (seconds), then pytest, which includes the
# Molecule scenarios (tests/roles/) and the demo's end-to-end node path (tests/e2e/).
# `scripts/test.sh lint|pytest|molecule|e2e` runs one part.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
part=${1:-all}

run_lint() {
  echo "== ruff (lint, and the formatting ruff format writes)"
  ruff check .
  ruff format --check .
  echo "== runtime/, the node agent and the scripts roles run on nodes parse as Python 3.8"
  python scripts/check_py38.py runtime/src infra/bootstrap/torchfleet_agent roles/preflight/library \
    roles/autostop/files roles/gpu_monitoring/files roles/pytorch/files
  if [ -d roles ] && compgen -G "roles/*/tasks" >/dev/null; then
    echo "== ansible-lint (production profile)"
    ansible-lint --profile production playbooks roles
  fi
}

run_pytest() {
  echo "== pytest"
  # pytest exits 5 when it collects nothing: that fails this script, as it should.
  python -m pytest "$@"
}

case "$part" in
  lint) run_lint ;;
  pytest) run_pytest -m "not molecule and not e2e" ;;
  molecule) run_pytest -m molecule ;;
  e2e) run_pytest -m e2e ;;
  all) run_lint; run_pytest ;;
  *) echo "usage: $0 [lint|pytest|molecule|e2e|all]" >&2; exit 2 ;;
esac
