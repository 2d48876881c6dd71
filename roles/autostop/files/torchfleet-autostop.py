#!/usr/bin/python3
"""torchfleet-autostop: stop an idle node.

The node is idle when BOTH hold:
  * no prediction for idle_minutes: torchfleet_last_request_timestamp_seconds (from the
    runtime's /metrics) is older than that, or there has been none and the service (or, when
    it is not running at all, the machine) started more than idle_minutes ago;
  * GPU utilisation is below gpu_threshold_percent on every GPU (nvidia-smi; without
    nvidia-smi the runtime's torchfleet_gpu_utilization_ratio; without either, no GPU: true).
Then it runs the stop command (default `systemctl poweroff`).

  torchfleet-autostop [--config FILE] [--dry-run] [--now UNIX_TIME]

--dry-run prints the decision as JSON and stops nothing. Exit 0 either way; 2 on a bad config.
Standard library only: it runs with the system python3 even when the runtime's venv is broken.
"""

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

DEFAULTS = {
    "idle_minutes": 30,
    "gpu_threshold_percent": 5,
    "metrics_url": "http://127.0.0.1:8080/metrics",
    "service": "torchfleet-runtime.service",
    "stop_command": "systemctl poweroff",
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def load_config(path):
    config = dict(DEFAULTS)
    try:
        with open(path) as f:
            config.update(json.load(f))
    except FileNotFoundError:
        pass
    unknown = set(config) - set(DEFAULTS)
    if unknown:
        raise ValueError(
            "{}: unknown key(s) {}; allowed: {}".format(
                path, ", ".join(sorted(unknown)), ", ".join(sorted(DEFAULTS))
            )
        )
    for key in ("idle_minutes", "gpu_threshold_percent"):
        if (
            isinstance(config[key], bool)
            or not isinstance(config[key], (int, float))
            or config[key] < 0
        ):
            raise ValueError(f"{path}: {key}={config[key]!r}; allowed: a number >= 0")
    return config


def parse_metrics(text):
    """{name: [value, ...]} from the Prometheus text format (labels dropped)."""
    samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            try:
                samples.setdefault(match.group(1), []).append(float(match.group(3)))
            except ValueError:
                continue
    return samples


def fetch_metrics(url, timeout=5.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return parse_metrics(response.read().decode("utf-8", "replace")), None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, str(exc)


def uptime_seconds():
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def service_started_at(service):
    """Unix time the service last became active, or None when it is not active."""
    try:
        out = subprocess.run(
            [
                "systemctl",
                "show",
                service,
                "-p",
                "ActiveState",
                "-p",
                "ActiveEnterTimestampMonotonic",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if props.get("ActiveState") != "active":
        return None
    try:
        monotonic_us = int(props.get("ActiveEnterTimestampMonotonic", "0"))
    except ValueError:
        return None
    if monotonic_us <= 0:
        return None
    # CLOCK_MONOTONIC and /proc/uptime count from the same boot (suspend aside).
    return time.time() - (uptime_seconds() - monotonic_us / 1e6)


def gpu_utilisation(samples):
    """(max utilisation in percent or None, where it came from)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout
            values = [float(v) for v in out.split() if v.strip()]
            if values:
                return max(values), "nvidia-smi"
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    ratios = (samples or {}).get("torchfleet_gpu_utilization_ratio")
    if ratios:
        return max(ratios) * 100.0, "metrics"
    return None, "no GPU"


def decide(config, now):
    idle_s = float(config["idle_minutes"]) * 60.0
    samples, error = fetch_metrics(config["metrics_url"])
    last = None
    if samples is not None:
        values = samples.get("torchfleet_last_request_timestamp_seconds") or [0.0]
        last = max(values) or None  # 0 means "no request yet"
    # Start and boot times are real wall-clock times; `now` (--now) only moves the judgement.
    started = service_started_at(config["service"])
    if last is not None:
        since, reference = last, "last request"
    elif started is not None:
        since, reference = started, "service start (no request yet)"
    else:
        # Not serving at all: nothing can use the node, count from boot.
        since, reference = time.time() - uptime_seconds(), "boot (service not active)"
    idle_for = max(0.0, now - since)
    gpu, gpu_source = gpu_utilisation(samples)
    requests_idle = idle_for >= idle_s
    gpu_idle = gpu is None or gpu < float(config["gpu_threshold_percent"])
    return {
        "stop": requests_idle and gpu_idle,
        "now": now,
        "idle_seconds": round(idle_for, 1),
        "idle_threshold_seconds": idle_s,
        "idle_since": reference,
        "metrics_error": error,
        "gpu_utilization_percent": gpu,
        "gpu_source": gpu_source,
        "gpu_threshold_percent": float(config["gpu_threshold_percent"]),
        "stop_command": config["stop_command"],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="torchfleet-autostop", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="/etc/torchfleet/autostop.json")
    parser.add_argument("--dry-run", action="store_true", help="print the decision, stop nothing")
    parser.add_argument("--now", type=float, help="pretend the time is this unix time (tests)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except (ValueError, OSError) as exc:
        print(f"torchfleet-autostop: error: {exc}", file=sys.stderr)
        return 2
    decision = decide(config, args.now if args.now is not None else time.time())
    decision["dry_run"] = args.dry_run
    print(json.dumps(decision, sort_keys=True))
    if decision["stop"] and not args.dry_run:
        sys.stdout.flush()
        return subprocess.run(shlex.split(config["stop_command"]), check=False).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
