"""`torchfleet-bench peers` (`make bench-peers`): the peer benchmark harness (bench.py) and its
parts: models, servers, wrk, report, process-tree figures, the offline ceiling. What is not
Python stays in benchmarks/peers/ (`PEERS_DIR`): the peers' apps, post.lua, install.sh and
run.sh, the pinned requirements."""

from pathlib import Path

PEERS_DIR = Path(__file__).resolve().parents[2] / "peers"
