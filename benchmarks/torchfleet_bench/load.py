"""`torchfleet-bench load`: closed-loop load on a runtime's /v1/predict, and the offline
(in-process) best-batch throughput of the same model, so served / offline is one number.

    torchfleet-bench load http://NODE:8080 --concurrency 1,8,32,64 [--binary] [--json OUT]
    torchfleet-bench load https://LB --token-file TOKEN [--cacert CA.pem]   (a stack's endpoint)
    torchfleet-bench load --offline model.pt        (needs torch; nothing else does)
    torchfleet-bench load URL --protocol v2 [--binary] [--server-pid PID]

Per concurrency level (`levels.run_level`) it reports throughput (requests/s and items/s),
p50/p90/p99 latency of successful requests, and errors by status code. Inputs are built from the
server's GET /v1/model (input_shape, dtype) with a fixed seed, sent as JSON `{"inputs": ...}`
or, with --binary, as raw little-endian bytes with X-Shape/X-Dtype (infra.client). With
`--protocol v2` the same tensor goes to the Open Inference Protocol's
/v2/models/{name}/infer: a JSON request, or with --binary the binary tensor extension (a JSON
header, then the raw bytes; the answer's outputs binary too). `--server-pid` (a runtime on this
machine) adds the server's CPU time per request, its edge processes included. Standard library
only, but for torch (--offline) and matplotlib (--plot).
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from infra.client import (
    Auth,
    ClientError,
    Target,
    build_payload,
    check_dtype,
    get_json,
    input_spec,
    nest,
    pack,
    post_answer,
    sample_values,
)
from torchfleet_bench import BenchError
from torchfleet_bench.levels import render_levels, run_level
from torchfleet_bench.offline import offline_benchmark
from torchfleet_bench.report import host_info, require_matplotlib, write_plot

DEFAULT_CONCURRENCY = (1, 8, 32, 64)
TOKEN_ENV = "TORCHFLEET_API_TOKEN"
DEFAULT_DURATION_S = 10.0
PROTOCOLS = ("v1", "v2")


def parse_concurrency(text: str) -> list[int]:
    try:
        levels = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        levels = []
    if not levels or any(n < 1 for n in levels):
        raise argparse.ArgumentTypeError(
            f"--concurrency {text!r}: expected a comma-separated list of positive integers, e.g. 1,8,32,64"
        )
    return levels


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(
            f"shape {text!r}: expected positive integers such as 3,64,64"
        )
    return dims


def _positive(kind: Callable[[str], Any], flag: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value <= 0:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected a positive number")
        return value

    return convert


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Closed-loop benchmark of a running server (throughput, p50/p90/p99, errors per "
        "concurrency) and/or the in-process best-batch throughput of a model (--offline)."
    )
    parser.add_argument(
        "url",
        nargs="?",
        metavar="URL",
        help="server base URL, e.g. http://127.0.0.1:8080 (optional with --offline)",
    )
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help="the API token to send (Authorization: Bearer), first line of PATH; default: "
        f"the environment's {TOKEN_ENV}, else none (a token on the command line would show in "
        "the process list)",
    )
    parser.add_argument(
        "--cacert",
        metavar="PEM",
        help="CA file an https server's certificate is checked against (default: the system's)",
    )
    parser.add_argument(
        "--concurrency",
        type=parse_concurrency,
        default=list(DEFAULT_CONCURRENCY),
        metavar="N[,N...]",
        help="requests in flight per level (default: 1,8,32,64)",
    )
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument(
        "--duration",
        type=_positive(float, "--duration"),
        metavar="S",
        help=f"seconds per level (default: {DEFAULT_DURATION_S:g})",
    )
    bound.add_argument(
        "--requests",
        type=_positive(int, "--requests"),
        metavar="N",
        help="requests per level instead of a duration",
    )
    parser.add_argument(
        "--batch",
        type=_positive(int, "--batch"),
        default=1,
        metavar="N",
        help="instances per request (default: 1)",
    )
    parser.add_argument(
        "--binary",
        action="store_true",
        help="send raw little-endian tensor bytes (X-Shape/X-Dtype) instead of JSON",
    )
    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default="v1",
        help="v1: POST /v1/predict; v2: the Open Inference Protocol's /v2/models/NAME/infer "
        "(JSON, or with --binary its binary tensor extension) (default: v1)",
    )
    parser.add_argument(
        "--server-pid",
        type=_positive(int, "--server-pid"),
        metavar="PID",
        help="a runtime on this machine: also report its CPU time per request (the process and "
        "its edge processes, from /proc)",
    )
    parser.add_argument(
        "--decimals",
        type=int,
        metavar="N",
        help="round JSON floats to N decimals (a shorter body; default: exact values)",
    )
    parser.add_argument(
        "--shape",
        type=parse_shape,
        metavar="D,D,...",
        help="input shape without the batch dim (default: from /v1/model or MODEL.json)",
    )
    parser.add_argument(
        "--dtype", metavar="NAME", help="input dtype (default: from /v1/model or MODEL.json)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        metavar="N",
        help="unmeasured requests per worker before each level (default: 1)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive(float, "--timeout"),
        default=60.0,
        metavar="S",
        help="per-request timeout (default: 60)",
    )
    parser.add_argument(
        "--json", dest="json_out", metavar="OUT", help="write the full results as JSON"
    )
    parser.add_argument(
        "--plot", metavar="PNG", help="write a latency/throughput plot (needs matplotlib)"
    )
    parser.add_argument(
        "--offline",
        metavar="MODEL",
        help="also measure in-process best-batch throughput of this TorchScript file",
    )
    parser.add_argument("--device", default="cpu", help="device for --offline (default: cpu)")
    parser.add_argument(
        "--optimize",
        choices=("auto", "off"),
        default="auto",
        help="--offline times the graph torchfleet-runtime serves (auto: its optimiser, as "
        "`serve` runs it by default) or the file as loaded (off)",
    )
    parser.add_argument(
        "--precision",
        choices=("fp32", "fp16", "bf16"),
        default="fp32",
        help="autocast precision for --offline (default: fp32)",
    )
    parser.add_argument(
        "--offline-max-batch",
        type=_positive(int, "--offline-max-batch"),
        default=64,
        metavar="N",
        help="largest batch --offline tries, powers of two (default: 64)",
    )
    parser.add_argument(
        "--offline-seconds",
        type=_positive(float, "--offline-seconds"),
        default=1.0,
        metavar="S",
        help="measured seconds per batch size for --offline (default: 1)",
    )


def _sidecar(model_path: str) -> dict[str, Any]:
    path = Path(model_path).with_suffix(".json")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _resolve_input(args: argparse.Namespace, info: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    shape, dtype = input_spec(info)
    shape = args.shape or shape
    dtype = args.dtype or dtype or "float32"
    if not shape:
        raise BenchError(
            "the input shape is unknown: the server's /v1/model and MODEL.json name no "
            "input_shape; pass --shape such as 3,64,64"
        )
    check_dtype(dtype)
    return tuple(shape), dtype


def v2_payload(
    shape: Sequence[int], dtype: str, batch: int, binary: bool, seed: int = 0
) -> tuple[bytes, dict[str, str]]:
    """(body, headers) for one Open Inference Protocol infer request of `batch` instances: the
    same values as build_payload's, as JSON `data` or as the binary tensor extension."""
    # the protocol's datatype names, from the runtime's torch-free codec (installed beside this
    # tool; only --protocol v2 needs it)
    from torchfleet_runtime.v2 import DATATYPES

    full = [batch, *shape]
    values = sample_values(math.prod(full), check_dtype(dtype), seed)
    tensor: dict[str, Any] = {"name": "input", "datatype": DATATYPES[dtype], "shape": full}
    if not binary:
        tensor["data"] = nest(values, full)
        body = json.dumps({"inputs": [tensor]}, separators=(",", ":")).encode()
        return body, {"Content-Type": "application/json"}
    raw = pack(values, dtype)
    tensor["parameters"] = {"binary_data_size": len(raw)}
    doc = {"inputs": [tensor], "parameters": {"binary_data_output": True}}
    head = json.dumps(doc, separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(head)),
    }
    return head + raw, headers


def _answer_rows(data: bytes, headers: dict[str, str], protocol: str) -> int | None:
    """How many instances an answer holds (None: not a shape this check knows)."""
    if protocol == "v1":
        outputs = json.loads(data).get("outputs")
        return len(outputs) if isinstance(outputs, list) else None
    n = headers.get("inference-header-content-length")
    doc = json.loads(data[: int(n)] if n else data)
    return int(doc["outputs"][0]["shape"][0])


def _probe(
    target: Target,
    route: str,
    body: bytes,
    headers: dict[str, str],
    batch: int,
    timeout: float,
    protocol: str = "v1",
) -> None:
    """One checked request before measuring: a wrong input must not become 10 s of 400s."""
    conn = target.connection(timeout)
    try:
        status, data, got = post_answer(conn, target.prefix + route, body, headers)
    except (OSError, http.client.HTTPException) as exc:
        raise BenchError(f"POST {target.url}{route}: {exc}") from None
    finally:
        conn.close()
    if status != 200:
        raise BenchError(f"POST {target.url}{route} answered {status}: {data[:300]!r}")
    try:
        rows = _answer_rows(data, got, protocol)
    except (ValueError, AttributeError, KeyError, IndexError, TypeError):
        raise BenchError(
            f"POST {route}: the answer is not the protocol's: {data[:200]!r}"
        ) from None
    if rows is not None and rows != batch:
        raise BenchError(f"POST {route}: sent {batch} instances, got {rows} outputs")


def auth_of(args: argparse.Namespace) -> Auth:
    """The token (--token-file's first line, else $TORCHFLEET_API_TOKEN) and the CA file."""
    token = os.environ.get(TOKEN_ENV) or None
    path = getattr(args, "token_file", None)
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.readline().strip() or None
        except OSError as exc:
            raise BenchError(f"--token-file {path}: {exc.strerror}") from None
    return Auth(token=token, cafile=getattr(args, "cacert", None))


def run_bench(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole command as a function returning the report (also used by benchmarks/)."""
    if not args.url and not args.offline:
        raise BenchError("give a server URL, --offline MODEL, or both")
    if args.warmup < 0:
        raise BenchError(f"--warmup {args.warmup}: must be >= 0")
    if args.plot and not args.url:
        raise BenchError("--plot draws served latency: it needs a server URL")
    if args.plot:
        require_matplotlib()
    duration = None if args.requests else (args.duration or DEFAULT_DURATION_S)
    report: dict[str, Any] = {
        "tool": "torchfleet-bench load",
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": host_info(),
        "url": None,
        "model": None,
        "config": {
            "concurrency": args.concurrency,
            "duration_s": duration,
            "requests": args.requests,
            "batch": args.batch,
            "body": "binary" if args.binary else "json",
            "protocol": args.protocol,
            "warmup_per_worker": args.warmup,
        },
        "levels": [],
        "offline": None,
        "served_over_offline": None,
    }
    info: dict[str, Any] = {}
    target = None
    if args.url:
        target = Target.parse(args.url, auth_of(args))
        report["url"] = target.url
        info = get_json(target, "/v1/model", args.timeout)
        report["model"] = info
    elif args.offline:
        info = _sidecar(args.offline)
    shape, dtype = _resolve_input(args, info)
    report["config"].update(input_shape=list(shape), dtype=dtype)

    if target is not None:
        if args.protocol == "v2":
            if args.decimals is not None:
                raise BenchError(
                    "--decimals rounds /v1 JSON bodies; --protocol v2 sends exact values"
                )
            route = f"/v2/models/{info.get('name', 'model')}/infer"
            body, headers = v2_payload(shape, dtype, args.batch, args.binary)
        else:
            route = "/v1/predict"
            body, headers = build_payload(
                shape, dtype, args.batch, args.binary, decimals=args.decimals
            )
        report["config"].update(body_bytes=len(body), route=route)
        _probe(target, route, body, headers, args.batch, args.timeout, args.protocol)
        bound = f"{args.requests} requests" if args.requests else f"{duration:g} s"
        log(
            f"bench {target.url} · batch {args.batch} · {report['config']['body']} body "
            f"{len(body) / 1024:.1f} KiB · input {'x'.join(map(str, shape))} {dtype} · {bound} per level"
        )
        for conc in args.concurrency:
            level = run_level(
                target,
                body,
                headers,
                conc,
                args.batch,
                args.requests,
                duration,
                args.warmup,
                args.timeout,
                route,
                args.server_pid,
            )
            report["levels"].append(asdict(level))
            log(
                render_levels([level]).splitlines()[-1]
                if report["levels"][1:]
                else render_levels([level])
            )

    if args.offline:
        sizes = [1 << i for i in range(int(math.log2(args.offline_max_batch)) + 1)]
        log(f"offline {args.offline} on {args.device} ({args.precision}), batch sizes {sizes}")
        report["offline"] = offline_benchmark(
            args.offline,
            shape,
            dtype,
            args.device,
            sizes,
            args.offline_seconds,
            args.precision,
            log,
            args.optimize,
        )
        best = report["offline"]["best"]
        log(f"offline best: {best['items_per_s']:.1f} items/s at batch {best['batch']}")
        if report["levels"]:
            report["served_over_offline"] = {
                str(lv["concurrency"]): round(lv["items_per_s"] / best["items_per_s"], 3)
                for lv in report["levels"]
            }
            log(
                "served / offline items/s: "
                + ", ".join(f"c={c}: {r:.2f}" for c, r in report["served_over_offline"].items())
            )
    if report["levels"]:
        cpu = [
            lv["client_cpu_us_per_request"]
            for lv in report["levels"]
            if lv["client_cpu_us_per_request"]
        ]
        if cpu:
            log(f"client CPU per request: {min(cpu):.0f}-{max(cpu):.0f} us")
        server = [lv["server_cpu_us_per_request"] for lv in report["levels"]]
        if any(s is not None for s in server):
            log("server CPU per request: " + ", ".join(f"{s:.0f} us" for s in server if s))
    return report


def run(args: argparse.Namespace) -> int:
    try:
        report = run_bench(args)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
            print(f"wrote {args.json_out}")
        if args.plot:
            write_plot(args.plot, report)
            print(f"wrote {args.plot}")
    except (BenchError, ClientError) as exc:
        print(f"torchfleet-bench load: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    failed = any(lv["ok"] == 0 for lv in report["levels"])
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchfleet-bench load")
    configure_parser(parser)
    return run(parser.parse_args(argv))
