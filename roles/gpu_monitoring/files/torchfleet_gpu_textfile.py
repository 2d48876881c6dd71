#!/usr/bin/env python3
"""Write NVIDIA GPU metrics for node-exporter's textfile collector.

Runs nvidia-smi once, turns every GPU's utilization, memory, temperature, power, ECC counters
and clock-throttle reasons into Prometheus text format, and replaces OUTPUT_DIR/torchfleet_gpu.prom
atomically (node-exporter must never read a half-written file). A failed nvidia-smi still
writes a file, with torchfleet_node_gpu_scrape_success 0, so an alert can see the exporter
working but the GPU not answering. Standard library only; Python 3.8+ (the node's system
Python, run by a systemd timer).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

PREFIX = "torchfleet_node_gpu_"
FIELDS = (
    "index",
    "uuid",
    "name",
    "driver_version",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "clocks_throttle_reasons.active",
)
MIB = 1024 * 1024
# (field, metric, help, scale) for the plain gauges.
GAUGES = (
    ("utilization.gpu", "utilization_ratio", "Share of time a kernel ran (0-1).", 0.01),
    (
        "utilization.memory",
        "memory_utilization_ratio",
        "Share of time memory was read or written (0-1).",
        0.01,
    ),
    ("memory.used", "memory_used_bytes", "GPU memory in use.", MIB),
    ("memory.total", "memory_total_bytes", "GPU memory in total.", MIB),
    ("temperature.gpu", "temperature_celsius", "GPU core temperature.", 1),
    ("power.draw", "power_draw_watts", "Board power draw.", 1),
    ("power.limit", "power_limit_watts", "Enforced power limit.", 1),
    (
        "ecc.errors.corrected.volatile.total",
        "ecc_corrected_errors",
        "Corrected ECC errors since the driver loaded.",
        1,
    ),
    (
        "ecc.errors.uncorrected.volatile.total",
        "ecc_uncorrected_errors",
        "Uncorrected ECC errors since the driver loaded.",
        1,
    ),
)
# Bits of clocks_throttle_reasons.active (nvml.h, nvmlClocksThrottleReason*).
THROTTLE_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def number(value):
    """nvidia-smi's value as a float, or None for "[N/A]", "[Not Supported]" and the like."""
    try:
        return float(value)
    except ValueError:
        return None


def label_value(value):
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def query(nvidia_smi):
    out = subprocess.run(
        [nvidia_smi, "--query-gpu=" + ",".join(FIELDS), "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    rows = []
    for line in out.splitlines():
        if line.strip():
            values = [v.strip() for v in line.split(",")]
            if len(values) != len(FIELDS):
                raise ValueError(
                    f"nvidia-smi returned {len(values)} fields, expected {len(FIELDS)}"
                )
            rows.append(dict(zip(FIELDS, values)))  # noqa: B905 - zip(strict=) needs 3.10
    return rows


def render(rows, success, now):
    lines = []

    def family(name, help_text, kind="gauge"):
        lines.append(f"# HELP {PREFIX}{name} {help_text}")
        lines.append(f"# TYPE {PREFIX}{name} {kind}")

    family("scrape_success", "1 when nvidia-smi answered, else 0.")
    lines.append(f"{PREFIX}scrape_success {int(success)}")
    family("scrape_timestamp_seconds", "Unix time of this scrape.")
    lines.append(f"{PREFIX}scrape_timestamp_seconds {now:.3f}")
    if rows:
        family("info", "GPU identity (value 1).")
        for row in rows:
            lines.append(
                '{}info{{gpu="{}",uuid="{}",name="{}",driver_version="{}"}} 1'.format(
                    *tuple(
                        [PREFIX]
                        + [label_value(row[k]) for k in ("index", "uuid", "name", "driver_version")]
                    )
                )
            )
    for field, metric, help_text, scale in GAUGES:
        samples = [(row["index"], number(row[field])) for row in rows]
        samples = [(gpu, value) for gpu, value in samples if value is not None]
        if samples:
            family(metric, help_text)
            lines.extend(
                f'{PREFIX}{metric}{{gpu="{gpu}"}} {repr(value * scale)}' for gpu, value in samples
            )
    masks = [(row["index"], row["clocks_throttle_reasons.active"]) for row in rows]
    masks = [(gpu, int(mask, 16)) for gpu, mask in masks if mask.lower().startswith("0x")]
    if masks:
        family("throttle_reason", "1 while this clock-throttle reason is active.")
        for gpu, mask in masks:
            for bit, reason in THROTTLE_REASONS:
                lines.append(
                    f'{PREFIX}throttle_reason{{gpu="{gpu}",reason="{reason}"}} {int(bool(mask & bit))}'
                )
    return "\n".join(lines) + "\n"


def write_atomically(directory, name, text):
    fd, tmp = tempfile.mkstemp(prefix="." + name + ".", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    args = parser.parse_args(argv)
    try:
        rows, success = query(args.nvidia_smi), True
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        print(f"torchfleet-gpu-metrics: nvidia-smi failed: {exc}", file=sys.stderr)
        rows, success = [], False
    write_atomically(args.output_dir, "torchfleet_gpu.prom", render(rows, success, time.time()))
    return 0 if success else 1


if __name__ == "__main__":
    sys.exit(main())
