"""The peer benchmark harness (benchmarks/peers/bench.py): models, servers, wrk, report."""
