#!/usr/bin/env bash
# The entry script of a GPU pack (`torchfleet-bench gpu-pack` copies it to PACK/run.sh). Run from
# the repository's root on a machine with no package index:
#   bash PACK/run.sh [gpu-peers options]    the GPU side by side (torchfleet-bench gpu-peers)
#   bash PACK/run.sh check                  scripts/gpu_check.sh with the same pack
# It installs the pack's wheels with `pip install --no-index --no-deps --target SITE`, then puts
# SITE and the tree on PYTHONPATH and the pack's wrk and libluajit on PATH / LD_LIBRARY_PATH.
# PYTHON (default python3) must already have torch; SITE: GPU_PACK_SITE (default a temp folder).
# Results go to $OUT/gpu-peers when the device tool sets OUT, else .cache/gpu-peers.
set -euo pipefail
PACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$PWD
PY=${PYTHON:-python3}
SITE=${GPU_PACK_SITE:-${TMPDIR:-/tmp}/torchfleet-gpu-site}
die() { echo "gpu-pack run.sh: $*" >&2; exit 2; }

[ -d "$REPO/benchmarks/torchfleet_bench" ] || die "run it from the repository's root (here: $REPO)"
"$PY" -c 'import torch' 2>/dev/null || die "$PY has no torch: the pack never carries it"
t0=$(date +%s)
rm -rf "$SITE"
"$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --target "$SITE" \
  "$PACK"/wheels/*.whl
export PYTHONPATH="$SITE:$REPO/benchmarks:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$PACK/bin:$SITE/bin:$PATH"
export LD_LIBRARY_PATH="$PACK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Mosec looks for its binary in the interpreter's script folders, not in a --target's bin/.
export PEERS_MOSEC_BIN="$SITE/bin/mosec"
"$PY" -m torchfleet_bench gpu-pack --verify "$PACK/manifest.json"
"$PY" -c 'import httptools, orjson, mosec, torchfleet_runtime, torchfleet_compat' ||
  die "a packed package does not import (see above)"
{ wrk --version 2>&1 || true; } | head -1  # wrk --version exits 1
command -v wrk >/dev/null || die "the pack's wrk is not runnable"
echo "gpu-pack: installed into $SITE in $(($(date +%s) - t0)) s"

if [ "${1:-}" = check ]; then
  shift
  GPU_CHECK_PREINSTALLED=1 PYTHON="$PY" exec "$REPO/scripts/gpu_check.sh" "$@"
fi
out=${OUT:+$OUT/gpu-peers}
exec "$PY" -m torchfleet_bench gpu-peers --out "${out:-$REPO/.cache/gpu-peers}" "$@"
