#!/usr/bin/env bash
# The runtime's GPU checks on a GPU machine, in one go and well under 8 minutes:
#   1. the GPU-marked tests (precision, memory-sized batch cap, OOM split, one replica per GPU with
#      its own metrics, load on every GPU, diagnose on CUDA): pytest -m gpu tests/runtime
#   2. torchfleet-runtime check --require-gpu (driver vs torch's CUDA, arch list, cuDNN, disk, memory)
#   3. torchfleet-bench gpu --device cuda: ONE TABLE of replicas on every GPU vs one GPU (scaling
#      efficiency, target >= 0.9), fp16 vs fp32, batching on/off, and the memory sizing (batch cap,
#      how it was chosen, memory_fraction, what the allocator reserved under load);
#   4. torchfleet-bench runtime --device cuda (served vs offline, JSON vs binary, start to ready,
#      first request vs steady p50), whose figures it prints.
#
# It expects a fresh machine with only this repository copied and a Python 3 with a CUDA build of
# torch already installed (it never downloads torch: the right build depends on the driver).
# The runtime goes, without dependencies, into a virtualenv that sees the system site packages;
# missing small dependencies (pytest, prometheus-client, PyYAML, httptools, orjson, numpy) are installed from the
# pins in requirements/ if an index is reachable. Exit status: 2 when there is no usable CUDA
# torch, else the number of failed steps (0: all passed).
#
# Usage: scripts/gpu_check.sh            (PYTHON=python3.11 to choose the interpreter)
# Results: benchmarks/results/gpu_check_cuda.json and runtime_bench_cuda.{json,png}, also copied
# to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.."

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

# A CUDA torch must already work: report what is there and stop otherwise.
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  "$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
"is_available() =", torch.cuda.is_available())' 2>&1 | tail -1
  echo "no usable CUDA torch for $PYTHON: install a CUDA build of torch (see compat/matrix.yml) and re-run"
  exit 2
fi
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
"device", torch.cuda.get_device_name(0), "arch list", torch.cuda.get_arch_list())'

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
    echo "could not install ${missing[*]} (no package index?): the steps needing them will fail"
fi

# The runtime and torchfleet-compat (its `check`): no dependencies (torch stays the system's), no
# build isolation (it would fetch setuptools). If even that fails (old setuptools), run them from
# the source tree.
if [ ${#PIP_TARGET_ARGS[@]} -gt 0 ] ||
  ! "$PY" -m pip install -q --no-deps --no-build-isolation -e compat -e runtime; then
  echo "runtime not installed: using PYTHONPATH=compat/src:runtime/src"
  export PYTHONPATH="$PWD/compat/src:$PWD/runtime/src${PYTHONPATH:+:$PYTHONPATH}"
fi
runtime() { "$PY" -c 'import sys; from torchfleet_runtime.cli import main; sys.exit(main())' "$@"; }

say "1/4 GPU tests: pytest -m gpu tests/runtime"
timeout "$STEP_TIMEOUT_TESTS" "$PY" -m pytest -m gpu tests/runtime -q
rc=$?
if [ $rc -eq 5 ]; then echo "no GPU-marked tests were collected"; fi
[ $rc -eq 0 ] || { echo "GPU tests: exit $rc"; failed=$((failed + 1)); }

say "2/4 torchfleet-runtime check --require-gpu"
runtime check --require-gpu --path "$PWD" || { echo "check: a check failed (see above)"; failed=$((failed + 1)); }

# The tool and infra's client (standard library) run from the source tree: nothing to install.
bench() { PYTHONPATH="$PWD/benchmarks:$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m torchfleet_bench "$@"; }

say "3/4 the GPU table: replicas vs one GPU, fp16 vs fp32, batching on/off, memory sizing"
timeout "$STEP_TIMEOUT_TABLE" bench gpu --device cuda --seconds "${GPU_TABLE_SECONDS:-10}" \
  --concurrency "${GPU_TABLE_CONCURRENCY:-64}" || { echo "GPU table: failed"; failed=$((failed + 1)); }

say "4/4 benchmark on cuda"
# --no-wrk: the wrk levels and the instrumentation rounds would not fit the step (run them by hand).
timeout "$STEP_TIMEOUT_BENCH" bench runtime --device cuda --duration 3 --budget-s 160 --no-wrk ||
  { echo "benchmark: failed"; failed=$((failed + 1)); }
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  cp benchmarks/results/runtime_bench_cuda.* benchmarks/results/gpu_check_cuda.json "$OUT"/ 2>/dev/null || true
fi

say "done: $failed failed step(s) in $(($(date +%s) - started)) s"
exit "$failed"
