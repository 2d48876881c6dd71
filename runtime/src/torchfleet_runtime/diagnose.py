"""`torchfleet-runtime diagnose`: what an on-call engineer needs from one node, in one screen.

It asks the running runtime (the address, token and TLS of its config file: api_token or the
first token of api_token_file, HTTPS pinned to its tls_cert_file; `--url` overrides the
address; on a converged node run it as the runtime's group, which owns the config): /readyz,
/v1/model and /metrics twice, `--window` seconds apart, and prints
- the node: state (with the replicas that fail, if degraded), who may call /v1/* (the
  runtime's own statement), versions (runtime, torch, CUDA,
  driver, Python), the model (version, format, precision, batch cap);
- traffic over the window: requests/s by status code and by route, latency p50/p99, queue depth;
- where the time goes: each stage's mean and p99 over the window (decode, queue, model,
  encode, write), per replica for the model stage;
- each replica: device, CPU set, threads, busy share of the window, its recent batch sizes;
- memory: per CUDA replica the caching allocator's allocated / reserved / inactive-split bytes,
  fragmentation, reserved share against the sizing's memory_fraction, alloc retries and OOMs
  (and their growth in the window), NVML's view of each GPU; the process's resident memory;
- findings: the signals past the alert thresholds (docs/runbooks.md), one line each.
`--json` prints the same as one JSON document. Standard library and the runtime's config reader
only (no torch import: it answers in well under a second plus the window). Exit status: 0 when
the runtime answered, 1 when it did not.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Tuple

from prometheus_client.parser import text_string_to_metric_families
from torchfleet_compat.histogram import quantile

from .auth import read_token_file
from .config import DEFAULT_CONFIG_FILE, ConfigError, load_config

DEFAULT_CONFIG_DIR = os.path.dirname(DEFAULT_CONFIG_FILE)

# The thresholds the alert rules use (roles/monitoring/files/rules/torchfleet-alerts.rules.yml):
# a finding here is the same signal an alert fires on, seen from the node.
FRAGMENTATION_RATIO = 0.3
SIZING_MARGIN = 0.05
STAGES = ("decode", "queue", "model", "encode", "write")

Samples = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", metavar="FILE", help="the runtime's config file (its address, token)"
    )
    p.add_argument("--url", help="the runtime's base URL (default: from the config)")
    p.add_argument("--window", type=float, default=5.0, help="seconds between the two scrapes")
    p.add_argument("--json", action="store_true", help="one JSON document instead of text")


class Target:
    """Where and how to ask the runtime: its base URL, a token it accepts, and for HTTPS the
    context that trusts the node's own certificate."""

    def __init__(self, base: str, token: str | None, context: ssl.SSLContext | None) -> None:
        self.base, self.token, self.context = base, token, context


def pinned_context(cert_file: str) -> ssl.SSLContext:
    """Trust exactly the certificate the runtime serves (its tls_cert_file), whoever issued it:
    diagnose asks over loopback, where the certificate's names do not match, so the pin is the
    check instead of the name; the image's HEALTHCHECK asks the same way)."""
    ctx = ssl.create_default_context(cafile=cert_file)
    ctx.verify_flags |= getattr(ssl, "VERIFY_X509_PARTIAL_CHAIN", 0x80000)  # a leaf as anchor
    ctx.check_hostname = False
    return ctx


def target(args: argparse.Namespace) -> Target:
    """The runtime's address, token and TLS from its config file (the token from api_token or
    the first of api_token_file; HTTPS when tls_cert_file is set); `--url` overrides the
    address. ConfigError when the config cannot be read (run as the runtime's group)."""
    if args.config is None and _unreadable(DEFAULT_CONFIG_DIR):
        raise ConfigError(
            f"cannot read {DEFAULT_CONFIG_FILE} ({DEFAULT_CONFIG_DIR} is the runtime group's): "
            "run as a member of that group, e.g. sudo -u torchfleet torchfleet-runtime diagnose"
        )
    cfg, _ = load_config(config_file=args.config)
    token = cfg.api_token
    if token is None and cfg.api_token_file:
        tokens = read_token_file(cfg.api_token_file)
        token = tokens[0] if tokens else None
    context = pinned_context(cfg.tls_cert_file) if cfg.tls_cert_file else None
    if args.url:
        return Target(args.url.rstrip("/"), token, context)
    host = cfg.host if cfg.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    scheme = "https" if context else "http"
    return Target(f"{scheme}://{host}:{cfg.port}", token, context)


def _unreadable(directory: str) -> bool:
    """The directory exists but this user may not enter it (is_file() then says False)."""
    return os.path.isdir(directory) and not os.access(directory, os.X_OK)


def _get(
    url: str,
    token: str | None = None,
    timeout: float = 10.0,
    context: ssl.SSLContext | None = None,
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def parse_metrics(text: str) -> Samples:
    """Every sample of a Prometheus exposition: (name, sorted labels) -> value."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def _select(samples: Samples, name: str, **match: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        labels: v
        for (n, labels), v in samples.items()
        if n == name and all(dict(labels).get(k) == want for k, want in match.items())
    }


def _sum(samples: Samples, name: str, **match: str) -> float:
    return sum(_select(samples, name, **match).values())


def _delta(new: Samples, old: Samples, name: str, **match: str) -> float:
    return _sum(new, name, **match) - _sum(old, name, **match)


def _histogram(new: Samples, old: Samples, name: str, **match: str) -> dict[str, Any]:
    """count, mean and p50/p99 (seconds) of a histogram's growth between two scrapes."""
    count = _delta(new, old, name + "_count", **match)
    total = _delta(new, old, name + "_sum", **match)
    buckets: dict[float, float] = {}
    for key in (new, old):
        sign = 1.0 if key is new else -1.0
        for labels, v in _select(key, name + "_bucket", **match).items():
            le = float(dict(labels)["le"])
            buckets[le] = buckets.get(le, 0.0) + sign * v
    return {
        "count": count,
        "mean_s": total / count if count else None,
        "p50_s": quantile(0.5, buckets) if count else None,
        "p99_s": quantile(0.99, buckets) if count else None,
    }


def collect(where: Target, window: float) -> dict[str, Any]:
    """Everything the report shows, as one document (raises OSError when nothing answers)."""
    base = where.base

    def get(path: str, token: str | None = None) -> tuple[int, bytes]:
        return _get(base + path, token, context=where.context)

    ready_status, ready_body = get("/readyz")
    status, card_body = get("/v1/model", where.token)
    card: dict[str, Any] = (
        json.loads(card_body) if status == 200 else {"error": card_body.decode(errors="replace")}
    )
    t0 = time.monotonic()
    before = parse_metrics(get("/metrics")[1].decode())
    time.sleep(window)
    after = parse_metrics(get("/metrics")[1].decode())
    seconds = time.monotonic() - t0
    devices = sorted(
        {dict(k).get("device", "") for k in _select(after, "torchfleet_replica_ready")}
    )
    codes: dict[str, float] = {}
    routes: dict[str, float] = {}
    for labels, v in _select(after, "torchfleet_requests_total").items():
        grew = v - before.get(("torchfleet_requests_total", labels), 0.0)
        if grew > 0:  # summed over the other label (a code over the routes, a route over codes)
            d = dict(labels)
            code, route = d["code"], d.get("route", "")
            codes[code] = codes.get(code, 0.0) + grew / seconds
            routes[route] = routes.get(route, 0.0) + grew / seconds
    doc: dict[str, Any] = {
        "node": socket.gethostname(),
        "url": base,
        "window_s": round(seconds, 2),
        "readyz": {"status": ready_status, "body": _json_or_text(ready_body)},
        "v1_model": {"status": status, "access": card.get("access")},
        "versions": {
            "runtime": card.get("runtime_version"),
            "torch": card.get("torch_version"),
            "cuda": card.get("cuda_version"),
            "driver": card.get("driver_version"),
            "python": platform.python_version(),
        },
        "model": {
            k: card.get(k)
            for k in ("model_version", "name", "format", "precision", "state", "max_batch_size")
        },
        "traffic": {
            "requests_per_s_by_code": {k: round(v, 2) for k, v in codes.items()},
            "requests_per_s_by_route": {k: round(v, 2) for k, v in routes.items()},
            "latency": _histogram(after, before, "torchfleet_request_duration_seconds"),
            "queue_depth": _sum(after, "torchfleet_queue_depth"),
            "inflight": _sum(after, "torchfleet_inflight_requests"),
        },
        "stages": {
            stage: _histogram(after, before, "torchfleet_stage_duration_seconds", stage=stage)
            for stage in STAGES
        },
        "replicas": [],
        "process": {"resident_bytes": _sum(after, "process_resident_memory_bytes")},
        "edges": {
            "workers": int(_sum(after, "torchfleet_edge_workers")),
            "restarts": int(_sum(after, "torchfleet_edge_restarts_total")),
            "resident_bytes": _sum(after, "torchfleet_edge_resident_memory_bytes"),
        },
        "gpus": [
            {
                "gpu": dict(k).get("gpu"),
                "device": dict(k).get("device") or None,
                "utilization": v,
                "used_bytes": _sum(after, "torchfleet_gpu_memory_used_bytes", gpu=dict(k)["gpu"]),
                "total_bytes": _sum(after, "torchfleet_gpu_memory_total_bytes", gpu=dict(k)["gpu"]),
            }
            for k, v in sorted(_select(after, "torchfleet_gpu_utilization_ratio").items())
        ],
    }
    by_label = {r.get("device"): r for r in card.get("replicas", [])}
    for device in devices or list(by_label):
        r = by_label.get(device, {"device": device})
        entry = {
            "device": device,
            "state": r.get("state"),
            "error": r.get("error"),
            "cpus": r.get("cpus"),
            "torch_threads": r.get("torch_threads"),
            "busy_share": round(
                _delta(after, before, "torchfleet_replica_busy_seconds_total", device=device)
                / seconds,
                3,
            ),
            "model_stage": _histogram(
                after, before, "torchfleet_stage_duration_seconds", stage="model", device=device
            ),
            "recent_batch_sizes": [b["size"] for b in r.get("recent_batches", [])],
            "memory": r.get("memory"),
        }
        if r.get("memory") and "error" not in r["memory"]:
            entry["memory_growth"] = {
                "alloc_retries": _delta(
                    after, before, "torchfleet_cuda_alloc_retries_total", device=device
                ),
                "ooms": _delta(after, before, "torchfleet_cuda_ooms_total", device=device),
            }
            entry["memory_fraction"] = _sum(after, "torchfleet_memory_fraction", device=device)
        doc["replicas"].append(entry)
    doc["findings"] = findings(doc)
    return doc


def _json_or_text(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


def findings(doc: dict[str, Any]) -> list[str]:
    """The signals past an alert's threshold, each with the runbook section it points to."""
    out = []
    runbook = "docs/runbooks.md#"
    if doc["readyz"]["status"] != 200:
        body = doc["readyz"]["body"]
        why = body.get("error", {}).get("message") if isinstance(body, dict) else body
        anchor = "torchfleetreplicadown" if "degraded" in str(why) else "torchfleetnodenotready"
        out.append(f"not ready: {why} ({runbook}{anchor})")
    for r in doc["replicas"]:
        mem, grew = r.get("memory") or {}, r.get("memory_growth") or {}
        if grew.get("alloc_retries"):
            out.append(
                f"{r['device']}: {grew['alloc_retries']:.0f} allocator retries in the window: "
                f"each flushes the cache and stalls the batch ({runbook}torchfleetgpuallocretries)"
            )
        if grew.get("ooms") or mem.get("ooms"):
            out.append(
                f"{r['device']}: {mem.get('ooms', 0)} CUDA OOMs since start "
                f"({runbook}torchfleetgpuoutofmemory)"
            )
        if mem.get("fragmentation", 0) > FRAGMENTATION_RATIO:
            out.append(
                f"{r['device']}: fragmentation {mem['fragmentation']:.2f} (inactive split / "
                f"reserved) > {FRAGMENTATION_RATIO} ({runbook}torchfleetgpumemoryfragmented)"
            )
        fraction = r.get("memory_fraction") or 0
        if fraction and mem.get("reserved_share", 0) > fraction + SIZING_MARGIN:
            out.append(
                f"{r['device']}: reserved {mem['reserved_share']:.2f} of the GPU > the sizing's "
                f"{fraction:.2f} + {SIZING_MARGIN} ({runbook}torchfleetgpumemoryabovesizing)"
            )
    stages = {s: v["mean_s"] for s, v in doc["stages"].items() if v["mean_s"] is not None}
    if stages:
        top = max(stages, key=lambda s: stages[s])
        total = sum(stages.values())
        if total and stages[top] / total > 0.5:
            out.append(
                f"{top} takes {stages[top] / total:.0%} of a request's time "
                f"({runbook}torchfleetlatencyspike)"
            )
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f} ms"


def _mib(v: Any) -> str:
    return "-" if v is None else f"{float(v) / 2**20:.0f} MiB"


def render(doc: dict[str, Any]) -> str:
    v, m, t = doc["versions"], doc["model"], doc["traffic"]
    lines = [
        f"node {doc['node']} ({doc['url']}), window {doc['window_s']} s",
        f"state {m.get('state')} (/readyz {doc['readyz']['status']})",
        f"predictions: {doc['v1_model']['access'] or '-'} (/v1/model {doc['v1_model']['status']})",
        "versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val),
        f"model {m.get('name')} {m.get('model_version')} ({m.get('format')}, "
        f"{m.get('precision')}), batch cap {m.get('max_batch_size')}",
        "",
        "traffic: "
        + (
            ", ".join(f"{c}: {r}/s" for c, r in sorted(t["requests_per_s_by_code"].items()))
            or "none"
        )
        + f"; p50 {_ms(t['latency']['p50_s'])}, p99 {_ms(t['latency']['p99_s'])}; "
        f"queue {t['queue_depth']:.0f}, in flight {t['inflight']:.0f}",
        "by route: "
        + (
            ", ".join(f"{k}: {r}/s" for k, r in sorted(t["requests_per_s_by_route"].items()))
            or "none"
        ),
        f"edge processes {doc['edges']['workers']} (restarts {doc['edges']['restarts']}, "
        f"{_mib(doc['edges']['resident_bytes'])} resident)",
        "",
        f"{'stage':<8} {'mean':>10} {'p99':>10} {'count':>8}",
    ]
    for stage, s in doc["stages"].items():
        lines.append(f"{stage:<8} {_ms(s['mean_s']):>10} {_ms(s['p99_s']):>10} {s['count']:>8.0f}")
    lines += [
        "",
        f"{'replica':<10} {'state':<8} {'cpus':<8} {'threads':>7} {'busy':>6} "
        f"{'model p99':>10}  recent batch sizes",
    ]
    for r in doc["replicas"]:
        cpus = ",".join(map(str, r["cpus"])) if r.get("cpus") else "-"
        sizes = " ".join(map(str, r["recent_batch_sizes"][-16:])) or "-"
        lines.append(
            f"{r['device']:<10} {str(r['state']):<8} {cpus:<8} {str(r['torch_threads']):>7} "
            f"{r['busy_share']:>6.0%} {_ms(r['model_stage']['p99_s']):>10}  {sizes}"
        )
        if r.get("error"):
            lines.append(f"{'':<10} error: {r['error']}")
        mem = r.get("memory")
        if mem and "error" not in mem:
            lines.append(
                f"{'':<10} memory: allocated {_mib(mem['allocated_bytes'])}, reserved "
                f"{_mib(mem['reserved_bytes'])} ({mem['reserved_share']:.0%} of "
                f"{_mib(mem['total_bytes'])}; sized to {r.get('memory_fraction', 0):.0%}), "
                f"inactive split {_mib(mem['inactive_split_bytes'])} (fragmentation "
                f"{mem['fragmentation']:.2f}), alloc retries {mem['alloc_retries']}, OOMs {mem['ooms']}"
            )
    for g in doc["gpus"]:
        lines.append(
            f"GPU {g['gpu']} ({g['device'] or 'not this runtime'}): {g['utilization']:.0%} busy, "
            f"{_mib(g['used_bytes'])} of {_mib(g['total_bytes'])} used (NVML)"
        )
    lines.append(f"process resident memory {_mib(doc['process']['resident_bytes'])}")
    lines += ["", "findings:"] + [f"  - {f}" for f in doc["findings"] or ["none"]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        where = target(args)
    except ConfigError as exc:
        print(f"torchfleet-runtime diagnose: {exc}", file=sys.stderr)
        return 2
    try:
        doc = collect(where, max(0.0, args.window))
    except OSError as exc:
        print(
            f"torchfleet-runtime diagnose: no runtime answers at {where.base}: {exc}",
            file=sys.stderr,
        )
        return 1
    print(json.dumps(doc, indent=1) if args.json else render(doc))
    return 0


__all__ = [
    "collect",
    "configure_parser",
    "findings",
    "parse_metrics",
    "pinned_context",
    "quantile",
    "render",
    "run",
    "target",
]
