"""The runtime's settings contract: every config key of torchfleet-runtime, typed, once.

Contract. `Config` is the runtime's settings record with its defaults; `FIELDS` holds, per key,
the parser of a raw value (a string from env or a flag, anything from YAML), the words saying
what is allowed, the check of a parsed value and the flag's help; `ENV_PREFIX` names the
environment (`TORCHFLEET_<KEY>`). `parse_value(key, raw)` turns one raw value into a checked one
or raises `ValueError` saying why. The runtime's config loader (torchfleet_runtime/config.py:
sources and precedence) parses with it; infra builds the runtime's environment in Kubernetes and
reads its defaults from it, and the inference_runtime role checks `inference_runtime_config`
keys against it, all without importing the runtime (which needs torch). `access(...)` is the
one rule of who may call /v1/*: a token, or loopback only, or `allow_unauthenticated` said in
so many words; the runtime refuses to start otherwise and states the answer at start, in
/v1/model and in `diagnose`.
Standard library only, Python 3.8+.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Callable

ENV_PREFIX = "TORCHFLEET_"


@dataclass(frozen=True)
class Config:
    model: str | None = None
    metadata: str | None = None
    model_format: str = "auto"
    factory: str | None = None
    input_shape: tuple[int, ...] | None = None
    dtype: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    device: str = "auto"
    devices: Any = "auto"  # "auto" | "all" | a tuple of replicas, each a tuple of device ids
    precision: str = "fp32"
    optimize: str = "auto"
    cuda_graphs: str = "auto"
    max_batch_size: int | None = None
    max_delay_ms: float = 5.0
    batch_wait: str = "arrivals"
    max_queue: int = 256
    memory_fraction: float = 0.7
    latency_budget_ms: float = 100.0
    warmup_iterations: int = 3
    sample_input: str | None = None
    drain_timeout_s: float = 30.0
    spot_watch: str = "auto"
    aws_metadata_url: str = "http://169.254.169.254"
    alicloud_metadata_url: str = "http://100.100.100.200"
    spot_poll_interval_s: float = 5.0
    log_level: str = "info"
    max_body_mb: float = 64.0
    stuck_timeout_s: float = 120.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 75.0
    max_connections: int = 1024
    edge_workers: int | None = None
    api_token: str | None = None
    api_token_file: str | None = None
    admin_token: str | None = None
    allow_unauthenticated: bool = False
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_min_version: str = "1.2"
    torch_threads: int | None = None
    torch_interop_threads: int | None = None
    log_format: str = "auto"
    log_summary_s: float = 10.0
    stage_timing: bool = True
    allow_non_finite_inputs: bool = False
    non_finite_outputs: str = "error"
    shadow_model: str | None = None
    shadow_sample: float = 0.1
    shadow_max_queue: int = 64
    shadow_top_k: int = 5

    def __repr__(self) -> str:  # never print a token (logs, tracebacks)
        shown = {
            f.name: (
                "***"
                if f.name.endswith("_token") and getattr(self, f.name)
                else getattr(self, f.name)
            )
            for f in dataclasses.fields(self)
        }
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)


# --- value parsers: each takes the raw value (str from env/flags, any from YAML) -------------


def _as_str(v: Any) -> str:
    if not isinstance(v, (str, int, float)) or isinstance(v, bool):
        raise ValueError("expected a string")
    return str(v)


def _as_int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError("expected an integer")
    if isinstance(v, int):
        return v
    if isinstance(v, str) and re.fullmatch(r"\s*[+-]?\d+\s*", v):
        return int(v)
    raise ValueError("expected an integer")


def _as_float(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError("expected a number")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ValueError("expected a number") from None


def _as_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "yes", "on", "1"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("false", "no", "off", "0"):
        return False
    raise ValueError("expected true or false")


def _as_token(v: Any) -> str:
    s = _as_str(v)
    if not re.fullmatch(r"[A-Za-z0-9._~+/=-]{16,512}", s):
        raise ValueError("expected 16-512 characters of A-Z a-z 0-9 . _ ~ + / = -")
    return s


def _as_optional_int(v: Any) -> int | None:
    if v is None or (isinstance(v, str) and v.strip().lower() in ("", "auto")):
        return None
    return _as_int(v)


def _as_shape(v: Any) -> tuple[int, ...]:
    if isinstance(v, str):
        v = [p for p in re.split(r"[,x\s]+", v.strip().strip("[]()")) if p]
    if not isinstance(v, (list, tuple)) or not v:
        raise ValueError("expected a list of positive integers such as 3,64,64")
    dims = tuple(_as_int(d) for d in v)
    if any(d <= 0 for d in dims):
        raise ValueError("expected a list of positive integers such as 3,64,64")
    return dims


# One replica's device ids: a GPU index, or a CPU set written as N or N-M (a range).
_ID_RANGE_RE = re.compile(r"(\d+)(?:-(\d+))?$")
MAX_REPLICAS = 64


def _as_id_set(v: Any) -> tuple[int, ...]:
    """One replica: an integer, "N-M", or (YAML) a list of integers."""
    if isinstance(v, (list, tuple)):
        ids = tuple(_as_int(i) for i in v)
    elif isinstance(v, int) and not isinstance(v, bool):
        ids = (v,)
    elif isinstance(v, str) and _ID_RANGE_RE.match(v.strip()):
        m = _ID_RANGE_RE.match(v.strip())
        assert m is not None
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"the range {v} runs backwards")
        ids = tuple(range(lo, hi + 1))
    else:
        raise ValueError(f"{v!r} is not a device id, N-M or a list of ids")
    if not ids or any(i < 0 for i in ids):
        raise ValueError("device ids are integers >= 0")
    return ids


def _as_devices(v: Any) -> str | tuple[tuple[int, ...], ...]:
    """auto | all | replicas: YAML [0, 2] or [[0, 1], [2, 3]]; env/flags "0,2" or "0-1,2-3"."""
    if isinstance(v, str) and v.strip().lower() in ("auto", "all"):
        return v.strip().lower()
    if isinstance(v, str):
        v = [p for p in re.split(r"[,\s]+", v.strip().strip("[]")) if p]
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, (list, tuple)) or not v:
        raise ValueError("expected auto, all or a list of device ids")
    replicas = tuple(_as_id_set(item) for item in v)
    seen: set[int] = set()
    for ids in replicas:
        if seen & set(ids):
            raise ValueError(f"device {sorted(seen & set(ids))[0]} is in two replicas")
        seen.update(ids)
    if len(replicas) > MAX_REPLICAS:
        raise ValueError(f"{len(replicas)} replicas; at most {MAX_REPLICAS}")
    return replicas


@dataclass(frozen=True)
class _Field:
    parse: Callable[[Any], Any]
    allowed: str  # human text for error messages
    check: Callable[[Any], bool] = lambda v: True
    help: str = ""


def _choice(*names: str, help: str = "") -> _Field:
    return _Field(_as_str, "one of " + ", ".join(names), lambda v: v in names, help)


_DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d+)?$")
_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8", "int8", "bool")

FIELDS: dict[str, _Field] = {
    "model": _Field(
        _as_str, "a path to the model file", help="model file (.pt TorchScript, state_dict, .onnx)"
    ),
    "metadata": _Field(
        _as_str, "a path to a JSON sidecar", help="metadata sidecar (default: MODEL with .json)"
    ),
    "model_format": _choice("auto", "torchscript", "eager", "onnx"),
    "factory": _Field(
        _as_str,
        "pkg.module:function",
        lambda v: re.fullmatch(r"[\w.]+:[\w.]+", v) is not None,
        help="eager model factory pkg.mod:fn; MODEL is then its state_dict",
    ),
    "input_shape": _Field(
        _as_shape,
        "positive integers such as 3,64,64",
        help="input shape without batch dim (overrides metadata)",
    ),
    "dtype": _choice(*_DTYPES),
    "host": _Field(_as_str, "an address to bind", help="bind address (default 127.0.0.1)"),
    "port": _Field(
        _as_int, "an integer 1-65535", lambda v: 0 <= v <= 65535, help="port (0 = any free port)"
    ),
    "device": _Field(
        _as_str, "auto, cpu, cuda or cuda:N", lambda v: _DEVICE_RE.match(v) is not None
    ),
    "devices": _Field(
        _as_devices,
        "auto, all, or a list of replicas: GPU indices [0, 2], or CPU sets [0, 1] / "
        '["0-1", "2-3"] (env and flags: 0,2 or 0-1,2-3)',
        help="one model replica per device: auto (every visible GPU; on CPU one replica over "
        "every usable CPU), all (every GPU; on CPU one replica per CPU), or a list",
    ),
    "precision": _choice("fp32", "fp16", "bf16"),
    "optimize": _choice(
        "auto",
        "off",
        help="auto: a CPU TorchScript fp32 model runs optimize_for_inference where checked "
        "right and faster; off: as loaded",
    ),
    "cuda_graphs": _choice(
        "auto",
        "off",
        help="auto: a CUDA replica captures a CUDA graph per warmed bucket at warm-up and "
        "replays those that answer as eager runs do and are faster; off: eager runs only",
    ),
    "max_batch_size": _Field(
        _as_optional_int,
        "auto or an integer >= 1",
        lambda v: v is None or v >= 1,
        help="batch cap (default auto: memory on CUDA, latency budget on CPU)",
    ),
    "max_delay_ms": _Field(
        _as_float,
        "a number >= 0",
        lambda v: v >= 0,
        help="longest a request waits for its batch to fill",
    ),
    "batch_wait": _choice("arrivals", "always"),
    "max_queue": _Field(
        _as_int,
        "an integer >= 1",
        lambda v: v >= 1,
        help="instances allowed to wait; beyond it 503 + Retry-After",
    ),
    "memory_fraction": _Field(_as_float, "a number in (0, 1]", lambda v: 0 < v <= 1),
    "latency_budget_ms": _Field(
        _as_float,
        "a number > 0",
        lambda v: v > 0,
        help="CPU: largest batch whose run fits this budget",
    ),
    "warmup_iterations": _Field(_as_int, "an integer >= 3", lambda v: v >= 3),
    "sample_input": _Field(_as_str, "a path to a .npy or torch .pt tensor file"),
    "drain_timeout_s": _Field(_as_float, "a number >= 0", lambda v: v >= 0),
    "spot_watch": _choice("auto", "aws", "alicloud", "off"),
    "aws_metadata_url": _Field(
        _as_str, "an http:// URL", lambda v: v.startswith(("http://", "https://"))
    ),
    "alicloud_metadata_url": _Field(
        _as_str, "an http:// URL", lambda v: v.startswith(("http://", "https://"))
    ),
    "spot_poll_interval_s": _Field(_as_float, "a number > 0", lambda v: v > 0),
    "log_level": _choice("debug", "info", "warning", "error"),
    "max_body_mb": _Field(_as_float, "a number > 0", lambda v: v > 0),
    "stuck_timeout_s": _Field(
        _as_float,
        "a number > 0",
        lambda v: v > 0,
        help="/livez fails when one batch runs longer than this",
    ),
    "header_timeout_s": _Field(
        _as_float,
        "a number > 0",
        lambda v: v > 0,
        help="a request's headers must arrive within this (else 408, close)",
    ),
    "body_timeout_s": _Field(
        _as_float,
        "a number > 0",
        lambda v: v > 0,
        help="longest pause while a body arrives (else 408, close)",
    ),
    "keepalive_timeout_s": _Field(
        _as_float,
        "a number > 0",
        lambda v: v > 0,
        help="an idle keep-alive connection is closed after this",
    ),
    "max_connections": _Field(
        _as_int,
        "an integer >= 1",
        lambda v: v >= 1,
        help="open connections at most; beyond it 503 and close",
    ),
    "edge_workers": _Field(
        _as_optional_int,
        "auto or an integer >= 0",
        lambda v: v is None or v >= 0,
        help="HTTP edge processes in front of the model owner (default auto: on a GPU node "
        "every usable CPU but one, at least 1; on a CPU node one per four usable CPUs, none "
        "below four; 0: the "
        "edge runs in the owner's process)",
    ),
    "api_token": _Field(
        _as_token, "16-512 token characters", help="bearer token required on /v1/* (default: none)"
    ),
    "api_token_file": _Field(
        _as_str,
        "a path to a file of tokens, one a line",
        help="more bearer tokens accepted on /v1/*, one a line (rotation: the current and the "
        "next); re-read when it changes and on reload",
    ),
    "admin_token": _Field(
        _as_token,
        "16-512 token characters",
        help="bearer token of POST /admin/reload (default: none, the admin API is off)",
    ),
    "allow_unauthenticated": _Field(
        _as_bool,
        "true or false",
        help="serve /v1/* without a token on a non-loopback host (default false: such a "
        "config is refused at start)",
    ),
    "tls_cert_file": _Field(
        _as_str,
        "a path to a PEM certificate (chain)",
        help="serve HTTPS with this certificate (with tls_key_file); default: plain HTTP",
    ),
    "tls_key_file": _Field(_as_str, "a path to the PEM private key of tls_cert_file"),
    "tls_min_version": _choice(
        "1.2", "1.3", help="the oldest TLS version the listener accepts (1.0 and 1.1 never)"
    ),
    "torch_threads": _Field(
        _as_optional_int,
        "auto or an integer >= 1",
        lambda v: v is None or v >= 1,
        help="torch intra-op threads (default auto: one per CPU this process may use, one "
        "fewer while that serves more under the load)",
    ),
    "torch_interop_threads": _Field(
        _as_optional_int,
        "auto or an integer >= 1",
        lambda v: v is None or v >= 1,
        help="torch inter-op threads (default auto: 1)",
    ),
    "log_format": _choice("auto", "json", "text"),
    "log_summary_s": _Field(
        _as_float,
        "a number >= 0",
        lambda v: v >= 0,
        help="seconds between batch-summary log lines at info (0: none)",
    ),
    "stage_timing": _Field(
        _as_bool, "true or false", help="per-stage histograms and the Server-Timing header"
    ),
    "allow_non_finite_inputs": _Field(
        _as_bool, "true or false", help="accept NaN/Inf in binary bodies"
    ),
    "non_finite_outputs": _choice("error", "null"),
    "shadow_model": _Field(
        _as_str,
        "a path to a candidate model file",
        help="shadow testing: run this candidate beside the serving model on a sampled share "
        "of requests, off the answer's path, and compare its outputs (default: none)",
    ),
    "shadow_sample": _Field(
        _as_float,
        "a number in [0, 1]",
        lambda v: 0 <= v <= 1,
        help="share of live requests also run on the shadow candidate",
    ),
    "shadow_max_queue": _Field(
        _as_int,
        "an integer >= 1",
        lambda v: v >= 1,
        help="instances waiting for the shadow candidate at most; beyond it a sample is dropped",
    ),
    "shadow_top_k": _Field(
        _as_int, "an integer >= 1", lambda v: v >= 1, help="k of the shadow's top-k agreement"
    ),
}
assert set(FIELDS) == {f.name for f in dataclasses.fields(Config)}


def defaults() -> dict[str, Any]:
    """Every key's default value."""
    return {f.name: f.default for f in dataclasses.fields(Config)}


def parse_value(key: str, raw: Any) -> Any:
    """`raw` for `key` parsed and checked (None stays None: unset). ValueError says why a value
    does not parse; its message is empty for one that parses but is not allowed."""
    field = FIELDS[key]
    value = None if raw is None else field.parse(raw)
    if value is not None and not field.check(value):
        raise ValueError("")
    return value


LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: only this machine reaches the listener."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost, or a wildcard such as ""
        return False


def access(host: str, tokens: bool, allow_unauthenticated: bool) -> str | None:
    """Who may call /v1/* (predictions), in words; None when the settings must be refused: a
    non-loopback `host` with no token (api_token, api_token_file) and no
    `allow_unauthenticated: true`."""
    if tokens:
        return "bearer token required"
    if is_loopback(host):
        return "no token: loopback only"
    if allow_unauthenticated:
        return f"no token: anyone who reaches {host} (allow_unauthenticated: true)"
    return None


UNAUTHENTICATED_ALLOWED = (
    "a loopback host (127.0.0.1, ::1, localhost); or api_token / api_token_file; or "
    "allow_unauthenticated: true to serve predictions to the network without a token on purpose"
)
