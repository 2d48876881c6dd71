#!/usr/bin/env bash
# Shadow testing's cost on the live path: the demo model served with no shadow ("off") and with
# a shadow candidate sampling every request ("on", shadow_sample 1.0: the worst case), alternated
# in the same minutes by `torchfleet-bench ab` (fresh server per round, wrk warm-up, measured run),
# at a light and a heavy concurrency. Prints req/s, p50/p99 per round and the medians, and the
# shadow's requests by result (compared, dropped_load, dropped_busy, ...) of each "on" run.
# Usage: benchmarks/shadow_overhead.sh [ROUNDS] [SECONDS]   (needs wrk; make setup installs it)
set -euo pipefail
cd "$(dirname "$0")/.."  # the paths below are the repository root's
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-8}
BENCH=${BENCH:-.venv/bin/torchfleet-bench}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
PY=${PY:-.venv/bin/python}
# The candidate is the demo model with its last layer's weights perturbed: same shape and cost,
# other outputs.
"$PY" - "$work" <<'PYEOF'
import json, sys
from pathlib import Path

import torch
from torchfleet_runtime.demo import build_demo_model, metadata, write_demo_model

work = Path(sys.argv[1])
write_demo_model(work / "live")
cand = build_demo_model()
with torch.no_grad():
    last = [p for p in cand.parameters()][-2]
    last.add_(torch.randn(last.shape, generator=torch.Generator().manual_seed(2)) * 0.05)
torch.jit.script(cand).save(str(work / "candidate.pt"))
(work / "candidate.json").write_text(json.dumps({**metadata(), "version": "candidate"}))
PYEOF
for c in 4 32; do
  echo "== concurrency $c"
  "$BENCH" ab --rounds "$ROUNDS" --seconds "$SECONDS_PER_RUN" --concurrency "$c" \
    --model "$work/live/model.pt" \
    "off=::--max-batch-size 8" \
    "on=::--max-batch-size 8 --shadow-model $work/candidate.pt --shadow-sample 1.0"
done
