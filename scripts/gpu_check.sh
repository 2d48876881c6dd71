#!/usr/bin/env bash
# The runtime's GPU checks on a GPU machine, in one go and well under 8 minutes:
#   1. the GPU-marked tests (precision, memory-sized batch cap, OOM split, one replica per GPU with
#      its own metrics, load on every GPU, diagnose on CUDA): pytest -m gpu on the files of
#      tests/runtime that hold them
#   2. torchfleet-runtime check --require-gpu (driver vs torch's CUDA, arch list, cuDNN, disk, memory)
#   3. torchfleet-bench gpu --device cuda: ONE TABLE of replicas on every GPU vs one GPU (scaling
#      efficiency, target >= 0.9), fp16 vs fp32, batching on/off, and the memory sizing (batch cap,
#      how it was chosen, memory_fraction, what the allocator reserved under load);
#   4. torchfleet-bench runtime --device cuda (served vs offline, JSON vs binary, start to ready,
#      first request vs steady p50), whose figures it prints.
#
# It expects a fresh machine with only this repository copied and a Python 3 with a CUDA build of
# torch already installed (it never downloads torch: the right build depends on the driver).
# With no package index: build a pack here first (`torchfleet-bench gpu-pack`, see
# benchmarks/README.md) and carry it; when GPU_PACK (default .cache/gpu-pack) holds one, this script
# runs through the pack's run.sh, which installs the pack's wheels (--no-index --target) and calls
# it back with GPU_CHECK_PREINSTALLED=1. Without a pack the runtime goes, without dependencies,
# into a virtualenv that sees the system site packages, and missing small dependencies (pytest,
# prometheus-client, PyYAML, httptools, orjson, numpy) are installed from the pins in requirements/
# if an index is reachable. Exit status: 2 when there is no usable CUDA torch, else the number of
# failed steps (0: all passed).
#
# Usage: scripts/gpu_check.sh [--dry-run]   (PYTHON=python3.11 to choose the interpreter)
#   --dry-run  on a machine without a GPU: every step that can runs on the CPU with short
#              durations (the GPU-marked tests skip themselves, `check` runs without
#              --require-gpu), results under .cache/gpu-check-dry-run; the GPU-only parts say
#              they were skipped. It proves the script's wiring, not any GPU figure.
# Results: benchmarks/results/gpu_check_cuda.json and runtime_bench_cuda.{json,png}, also copied
# to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
for arg in "$@"; do
  case $arg in
    --dry-run) DRY_RUN=1 ;;
    *) echo "gpu_check.sh: argument = '$arg' is invalid; allowed: --dry-run" >&2; exit 2 ;;
  esac
done
GPU_PACK=${GPU_PACK:-.cache/gpu-pack}
if [ -z "${GPU_CHECK_PREINSTALLED:-}" ] && [ -f "$GPU_PACK/run.sh" ]; then
  echo "using the pack in $GPU_PACK (no package index needed)"
  exec bash "$GPU_PACK/run.sh" check "$@"
fi

PYTHON=${PYTHON:-python3}
VENV=${GPU_CHECK_VENV:-.cache/gpu-venv}
STEP_TIMEOUT_TESTS=${STEP_TIMEOUT_TESTS:-240}
STEP_TIMEOUT_TABLE=${STEP_TIMEOUT_TABLE:-200}
STEP_TIMEOUT_BENCH=${STEP_TIMEOUT_BENCH:-180}
started=$(date +%s)
failed=0

say() { printf '\n[gpu_check %3ss] %s\n' "$(($(date +%s) - started))" "$*"; }

say "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null ||
  echo "nvidia-smi not available"
"$PYTHON" --version

# A CUDA torch must already work: report what is there and stop otherwise (a dry run goes on on
# the CPU).
DEVICE=cuda
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  "$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
"is_available() =", torch.cuda.is_available())' 2>&1 | tail -1
  if [ "$DRY_RUN" = 0 ]; then
    echo "no usable CUDA torch for $PYTHON: install a CUDA build of torch (see compat/matrix.yml) and re-run"
    echo "(scripts/gpu_check.sh --dry-run runs every step it can on the CPU)"
    exit 2
  fi
  DEVICE=cpu
  echo "DRY RUN on the CPU: no usable CUDA (nvidia-smi $(command -v nvidia-smi >/dev/null && echo present || echo absent));" \
    "the GPU-only parts are skipped and say so, the figures are not GPU figures"
else
  "$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
"device", torch.cuda.get_device_name(0), "arch list", torch.cuda.get_arch_list())'
fi
RESULTS=benchmarks/results
if [ "$DEVICE" = cpu ]; then RESULTS=.cache/gpu-check-dry-run; mkdir -p "$RESULTS"; fi

if [ -n "${GPU_CHECK_PREINSTALLED:-}" ]; then
  # run.sh of a pack installed every dependency and the runtime, and set PYTHONPATH
  say "packages from the pack (PYTHONPATH set by its run.sh)"
  PY=$PYTHON
else
  say "virtualenv $VENV (system site packages: the preinstalled torch)"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv --system-site-packages "$VENV" || exit 2
  PY="$VENV/bin/python"
  PIP_TARGET_ARGS=()
  if ! "$PY" -c 'import torch' 2>/dev/null; then
    # PYTHON is itself a virtualenv: a venv made from it sees the base interpreter, not its torch
    echo "the venv cannot see $PYTHON's torch: using $PYTHON itself, extra packages in .cache/gpu-deps"
    PY=$PYTHON
    PIP_TARGET_ARGS=(--target .cache/gpu-deps)
    export PYTHONPATH="$PWD/.cache/gpu-deps${PYTHONPATH:+:$PYTHONPATH}"
  fi

  # Install only what is missing, at the repo's pins; no index reachable is not fatal by itself.
  pin() { grep -hiE "^$1==" requirements/*.txt 2>/dev/null | head -1; }
  missing=()
  for mod_pkg in pytest:pytest prometheus_client:prometheus-client yaml:PyYAML httptools:httptools orjson:orjson \
                 numpy:numpy pytest_timeout:pytest-timeout pynvml:nvidia-ml-py; do
    mod=${mod_pkg%%:*} pkg=${mod_pkg#*:}
    if ! "$PY" -c "import $mod" 2>/dev/null; then
      spec=$(pin "$pkg")
      missing+=("${spec:-$pkg}")
    fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing missing packages: ${missing[*]}"
    "$PY" -m pip install -q --timeout 20 --retries 1 "${PIP_TARGET_ARGS[@]}" "${missing[@]}" ||
      echo "could not install ${missing[*]} (no package index? build a pack: torchfleet-bench gpu-pack): the steps needing them will fail"
  fi

  # The runtime and torchfleet-compat (its `check`): no dependencies (torch stays the system's), no
  # build isolation (it would fetch setuptools). If even that fails (old setuptools), run them from
  # the source tree.
  if [ ${#PIP_TARGET_ARGS[@]} -gt 0 ] ||
    ! "$PY" -m pip install -q --no-deps --no-build-isolation -e compat -e runtime; then
    echo "runtime not installed: using PYTHONPATH=compat/src:runtime/src"
    export PYTHONPATH="$PWD/compat/src:$PWD/runtime/src${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
# Commands, not shell functions: `timeout` runs a program and can never run a function.
RUNTIME=("$PY" -c 'import sys; from torchfleet_runtime.cli import main; sys.exit(main())')
# The tool and infra's client (standard library) run from the source tree: nothing to install.
BENCH=(env "PYTHONPATH=$PWD/benchmarks:$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m torchfleet_bench)

say "1/4 GPU tests: pytest -m gpu (the files of tests/runtime that hold them)"
# Only the files that hold GPU-marked tests: collecting the others imports the dev requirements
# (trustme, ...) that a GPU machine does not have, for tests `-m gpu` would deselect anyway.
mapfile -t GPU_TEST_FILES < <(grep -lE 'mark\.gpu' tests/runtime/*.py)
timeout "$STEP_TIMEOUT_TESTS" "$PY" -m pytest -m gpu "${GPU_TEST_FILES[@]}" -q
rc=$?
if [ $rc -eq 5 ]; then echo "no GPU-marked tests were collected"; fi
[ $rc -eq 0 ] || { echo "GPU tests: exit $rc"; failed=$((failed + 1)); }

say "2/4 torchfleet-runtime check --require-gpu"
REQUIRE_GPU=(--require-gpu)
if [ "$DEVICE" = cpu ]; then
  echo "dry run: --require-gpu skipped (no CUDA); the other checks run"
  REQUIRE_GPU=()
fi
"${RUNTIME[@]}" check "${REQUIRE_GPU[@]}" --path "$PWD" ||
  { echo "check: a check failed (see above)"; failed=$((failed + 1)); }

say "3/4 the GPU table: replicas vs one GPU, fp16 vs fp32, batching on/off, memory sizing"
TABLE_ARGS=(--seconds "${GPU_TABLE_SECONDS:-10}" --concurrency "${GPU_TABLE_CONCURRENCY:-64}")
if [ "$DEVICE" = cpu ]; then
  echo "dry run: fp16 (CUDA only) skipped; the other variants on the CPU, 1 s each"
  TABLE_ARGS=(--seconds 1 --concurrency 4 --variants one,all,no-batching)
fi
timeout "$STEP_TIMEOUT_TABLE" "${BENCH[@]}" gpu --device "$DEVICE" "${TABLE_ARGS[@]}" \
  --out "$RESULTS/gpu_check_$DEVICE.json" || { echo "GPU table: failed"; failed=$((failed + 1)); }

say "4/4 benchmark on $DEVICE"
# --no-wrk: the wrk levels and the instrumentation rounds would not fit the step (run them by hand).
BENCH_ARGS=(--duration 3 --budget-s 160)
[ "$DEVICE" = cpu ] && BENCH_ARGS=(--duration 1 --budget-s 40 --concurrency 1,8 --offline-seconds 0.5)
timeout "$STEP_TIMEOUT_BENCH" "${BENCH[@]}" runtime --device "$DEVICE" "${BENCH_ARGS[@]}" --no-wrk \
  --out "$RESULTS" || { echo "benchmark: failed"; failed=$((failed + 1)); }
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  cp "$RESULTS/runtime_bench_$DEVICE".* "$RESULTS/gpu_check_$DEVICE.json" "$OUT"/ 2>/dev/null || true
fi

say "done: $failed failed step(s) in $(($(date +%s) - started)) s"
exit "$failed"
