#!/usr/bin/env bash
# Every test suite, in order of speed: lint first (seconds), the docs site, then the tests that
# need no container on both cores (pytest-xdist), then the ones that converge or run containers,
# one at a time (Molecule scenarios, the node bootstrap, the demo's node path, the runtime image).
# `scripts/test.sh check` is the fast tier (lint + every test without a container: `make check`);
# `scripts/test.sh lint|docs|pytest|molecule|e2e|containers` runs one part; `scripts/test.sh format`
# writes what lint's ruff steps check (`make format`).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
part=${1:-all}

run_lint() {
  echo "== ruff (lint, and the formatting ruff format writes)"
  ruff check .
  ruff format --check .
  echo "== mypy (pyproject.toml [tool.mypy]: infra, runtime, torchfleet-compat, the bench tool)"
  mypy
  echo "== infra's layers (import-linter: pyproject.toml [tool.importlinter]) and no circle of imports"
  lint-imports --no-cache
  python scripts/check_import_circles.py
  echo "== runtime/, compat/, the node agent and the scripts roles run on nodes parse as Python 3.8"
  python scripts/check_py38.py runtime/src compat/src infra/bootstrap/torchfleet_agent \
    roles/preflight/library roles/autostop/files roles/gpu_monitoring/files roles/pytorch/files \
    infra/billing.py
  if [ -d roles ] && compgen -G "roles/*/tasks" >/dev/null; then
    # no paths: as editors and users run it, so .ansible-lint alone says what is Ansible content
    echo "== ansible-lint (production profile, .ansible-lint)"
    ansible-lint
  fi
}

# What run_lint's ruff steps check, written: the formatting, then the fixes ruff can make safely.
run_format() {
  echo "== ruff format, ruff check --fix"
  ruff format .
  ruff check --fix .
}

run_docs() {
  echo "== the docs site (mkdocs build --strict into .cache/site/)"
  # NO_MKDOCS_2_WARNING: Material prints a banner about its successor on every build
  NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir .cache/site
}

# Tests that start podman containers (or build their images): these run one at a time.
CONTAINERS="molecule or e2e or image"

run_pytest() {
  echo "== pytest"
  # pytest exits 5 when it collects nothing: that fails this script, as it should.
  python -m pytest "$@"
}

# --dist loadfile keeps a file's tests (and its module fixtures) on one worker.
run_fast() { run_pytest -n 2 --dist loadfile -m "not ($CONTAINERS)"; }

case "$part" in
  lint) run_lint ;;
  format) run_format ;;
  check) run_lint; run_docs; run_fast ;;
  docs) run_docs ;;
  pytest) run_pytest -m "not molecule and not e2e" ;;
  molecule) run_pytest -m molecule ;;
  e2e) run_pytest -m e2e ;;
  containers) run_pytest -m "$CONTAINERS" ;;
  all) run_lint; run_docs; run_fast; run_pytest -m "$CONTAINERS" ;;
  *) echo "usage: $0 [lint|format|check|docs|pytest|molecule|e2e|containers|all]" >&2; exit 2 ;;
esac
