"""torchfleet_bench.local: the machine-side helpers every server benchmark uses."""

from __future__ import annotations

import subprocess
import sys
import time

from torchfleet_bench.local import cpu_s, free_port, loopback


def test_a_free_port_is_free_and_nothing_answers_there():
    port = free_port()
    assert 1024 <= port < 65536
    assert loopback(port, "GET", "/readyz", timeout=2) == (None, b"")


def test_cpu_seconds_of_a_busy_process_grow():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        first = cpu_s(busy.pid)
        time.sleep(0.5)
        assert cpu_s(busy.pid) > first
    finally:
        busy.kill()
        busy.wait()
