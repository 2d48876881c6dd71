#!/usr/bin/env bash
# Server CPU per request by wire format: /v1 JSON, /v1 binary (X-Shape/X-Dtype), /v2 JSON and /v2
# binary (the Open Inference Protocol's binary tensor extension), the same tensor each time, on
# one runtime serving the demo model on this machine. `torchfleet-bench load --server-pid` reads
# the server's CPU time (its process and edge processes, /proc) before and after each bounded
# run; the formats alternate for ROUNDS rounds and the table gives each one's median.
# Usage: benchmarks/protocol_cpu.sh [ROUNDS] [REQUESTS] [EDGE_WORKERS]
set -euo pipefail
cd "$(dirname "$0")/.."  # the paths below are the repository root's
ROUNDS=${1:-3}
REQUESTS=${2:-400}
EDGES=${3:-0}
PY=${PY:-.venv/bin/python}
BENCH=${BENCH:-.venv/bin/torchfleet-bench}
RUNTIME=${RUNTIME:-.venv/bin/torchfleet-runtime}
work=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
"$RUNTIME" demo-model "$work/demo" >/dev/null
port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$RUNTIME" serve --model "$work/demo/model.pt" --port "$port" --edge-workers "$EDGES" \
  --log-level warning >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 120); do
  curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null || { cat "$work/serve.log"; exit 1; }
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); edge_workers $EDGES; $REQUESTS requests x $ROUNDS rounds at concurrency 8"
for r in $(seq "$ROUNDS"); do
  for mode in "v1 json" "v1 binary" "v2 json" "v2 binary"; do
    read -r protocol body <<<"$mode"
    flag=()
    if [ "$body" = binary ]; then flag=(--binary); fi
    "$BENCH" load "http://127.0.0.1:$port" --protocol "$protocol" "${flag[@]}" --concurrency 8 \
      --requests "$REQUESTS" --server-pid "$pid" --json "$work/$protocol-$body-$r.json" >/dev/null
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$work" "$ROUNDS" <<'PYEOF'
import json, statistics, sys
from pathlib import Path

work, rounds = Path(sys.argv[1]), int(sys.argv[2])
print(f"{'format':<12}{'server CPU us/req':>20}{'client CPU us/req':>20}{'req/s':>10}{'body bytes':>12}")
for mode in ("v1-json", "v1-binary", "v2-json", "v2-binary"):
    runs = [json.loads((work / f"{mode}-{r}.json").read_text()) for r in range(1, rounds + 1)]
    level = [run["levels"][0] for run in runs]
    med = lambda key: statistics.median(lv[key] for lv in level)  # noqa: E731
    print(
        f"{mode:<12}{med('server_cpu_us_per_request'):>20.0f}"
        f"{med('client_cpu_us_per_request'):>20.0f}{med('throughput_rps'):>10.1f}"
        f"{runs[0]['config']['body_bytes']:>12}"
    )
PYEOF
