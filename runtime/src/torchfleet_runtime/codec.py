"""Request decoding and response encoding, with no numpy on the request path.

Three request forms reach the model as one tensor shaped (N, *input_shape):
- JSON `{"inputs": nested list}`, one instance or a batch. orjson parses it (strict JSON: NaN,
  Infinity and nesting deeper than 1024 are refused by the parser); the nested lists are then
  flattened level by level in C (itertools.chain) into an `array.array` that torch wraps without
  another per-element pass, checking raggedness as it goes.
- `application/octet-stream`: raw little-endian bytes with X-Shape and X-Dtype headers.
- `application/x-npy`: a .npy file (header parsed here with a size cap and a strict schema, so
  numpy need not be installed or working: torch 1.12 with numpy 2 cannot convert at all).
Byte order is little-endian, as on every x86-64 and arm64 node.

Non-finite numbers: JSON cannot carry them (orjson refuses the literals); binary bodies holding
NaN or Inf are refused unless `allow_non_finite_inputs` (check_finite=False here). A JSON answer
whose outputs hold NaN/Inf is an `ApiError` 500 `non_finite_output` with `non_finite_outputs:
error` (the default) or carries `null` in their place with `null`: never a bare NaN token.
Every refusal is an `ApiError` (errors.py).
"""

from __future__ import annotations

import array
import ast
import itertools
import struct
from typing import Any, Mapping

import orjson
import torch

from . import compat
from .errors import ApiError, bad_input
from .tensors import DTYPE_NAMES, DTYPES, ELEMENT_SIZE, Outputs, non_finite, prod

# array.array typecodes for the dtypes JSON can carry exactly; others go through float32/int64.
_ARRAY_CODES = {
    torch.float32: "f",
    torch.float64: "d",
    torch.int64: "q",
    torch.int32: "i",
    torch.uint8: "B",
    torch.int8: "b",
}
_NPY_DTYPES = {
    "<f4": "float32",
    "<f8": "float64",
    "<f2": "float16",
    "<i8": "int64",
    "<i4": "int32",
    "|u1": "uint8",
    "|i1": "int8",
    "|b1": "bool",
}
NPY_MAX_HEADER = 10_000  # numpy's own cap on a header it will parse without allow_pickle games
JSON_TYPES = ("application/json", "")
MEDIA_TYPES = (
    "application/json, application/octet-stream (with X-Shape and X-Dtype) or application/x-npy"
)


def media_type(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


def decode(
    body: bytes | bytearray,
    content_type: str,
    headers: Mapping[str, str],
    input_shape: tuple[int, ...],
    dtype: torch.dtype,
    check_finite: bool = True,
) -> tuple[torch.Tensor, bool]:
    """-> (tensor shaped (N, *input_shape), batched) where batched=False means one bare instance.

    `headers` maps lower-case header names to values (X-Shape/X-Dtype for raw bodies)."""
    ctype = media_type(content_type)
    if ctype not in JSON_TYPES and ctype not in ("application/octet-stream", "application/x-npy"):
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Content-Type {ctype!r} is not supported; use {MEDIA_TYPES}",
        )
    if not body:
        raise bad_input("the request body is empty", "empty_input")
    if ctype in JSON_TYPES:
        tensor = decode_json(body, dtype)
    else:
        if ctype == "application/octet-stream":
            tensor = decode_raw(body, headers.get("x-shape"), headers.get("x-dtype"), dtype)
        else:
            tensor = decode_npy(body, dtype)
        if check_finite and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise bad_input(
                "the input holds NaN or Inf values (config key allow_non_finite_inputs)",
                "non_finite_input",
            )
    return _check_shape(tensor, input_shape)


def _check_shape(tensor: torch.Tensor, input_shape: tuple[int, ...]) -> tuple[torch.Tensor, bool]:
    shape = tuple(tensor.shape)
    if shape == input_shape:
        return tensor.unsqueeze(0), False
    if len(shape) == len(input_shape) + 1 and shape[1:] == input_shape:
        if shape[0] == 0:
            raise bad_input("the batch has no instances", "empty_input")
        return tensor, True
    want = ",".join(map(str, input_shape))
    raise bad_input(
        f"input shape {list(shape)} does not match the model: expected [{want}] for one "
        f"instance or [N,{want}] for a batch",
        "wrong_shape",
    )


def decode_json(body: bytes | bytearray, dtype: torch.dtype) -> torch.Tensor:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:  # also invalid UTF-8, NaN literals, nesting > 1024
        raise bad_input(f"the body is not valid JSON ({exc})", "malformed_json") from None
    if not isinstance(doc, dict) or "inputs" not in doc:
        raise bad_input('expected a JSON object {"inputs": [...]}', "malformed_json")
    data = doc["inputs"]
    if not isinstance(data, list):
        raise bad_input(
            "'inputs' must be a (nested) list of numbers",
            "wrong_dtype" if data is not None else "empty_input",
        )
    if not data:
        raise bad_input("'inputs' is empty", "empty_input")
    shape = [len(data)]
    level: list[Any] = data
    # Flatten one nesting level at a time, checking every sub-list has the same length.
    while isinstance(level[0], list):
        n = len(level[0])
        try:
            if any(len(x) != n for x in level):
                raise bad_input(
                    "'inputs' is ragged: sub-lists at one depth differ in length", "wrong_shape"
                )
        except TypeError:  # a number (or a string, an object) where a list was expected
            raise bad_input(
                "'inputs' mixes numbers and lists at one depth", "wrong_shape"
            ) from None
        if n == 0:
            raise bad_input("'inputs' contains an empty list", "empty_input")
        shape.append(n)
        level = list(itertools.chain.from_iterable(level))
    return _flat_to_tensor(level, shape, dtype)


def _flat_to_tensor(flat: list[Any], shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    code = _ARRAY_CODES.get(dtype)
    try:
        if code is not None:
            arr = array.array(code, flat)
            t = (
                torch.frombuffer(arr, dtype=dtype)
                if compat.HAS_FROMBUFFER
                else torch.tensor(arr, dtype=dtype)
            )
        else:  # float16 / bfloat16 / bool: via a wide type, then cast
            t = torch.tensor(
                flat, dtype=torch.float32 if dtype.is_floating_point else torch.int64
            ).to(dtype)
    except (TypeError, OverflowError, ValueError) as exc:
        kind = "numbers" if dtype.is_floating_point else f"integers fitting {DTYPE_NAMES[dtype]}"
        raise bad_input(f"'inputs' must contain only {kind} ({exc})", "wrong_dtype") from None
    return t.reshape(shape)


def _parse_shape(text: str | None) -> tuple[int, ...]:
    if not text:
        raise bad_input("a binary body needs an X-Shape header such as 4,3,64,64", "missing_header")
    parts = [p for p in text.replace(" ", "").split(",") if p]
    if not parts or len(parts) > 32 or not all(p.isdigit() and len(p) <= 12 for p in parts):
        raise bad_input(
            f"X-Shape {text[:80]!r} is not a comma-separated list of non-negative integers",
            "wrong_shape",
        )
    return tuple(int(p) for p in parts)


def _check_dtype(name: str, expect: torch.dtype | None) -> None:
    if expect is not None and DTYPES[name] != expect:
        raise bad_input(
            f"dtype {name} does not match the model's {DTYPE_NAMES[expect]}", "wrong_dtype"
        )


def decode_raw(
    body: bytes | bytearray,
    shape_header: str | None,
    dtype_header: str | None,
    expect: torch.dtype | None = None,
) -> torch.Tensor:
    shape = _parse_shape(shape_header)
    if not dtype_header:
        raise bad_input("a binary body needs an X-Dtype header such as float32", "missing_header")
    name = dtype_header.strip().lower()
    if name not in DTYPES:
        raise bad_input(
            f"X-Dtype {dtype_header[:40]!r} is not one of {', '.join(DTYPES)}", "wrong_dtype"
        )
    _check_dtype(name, expect)
    return _tensor_from_bytes(body, shape, name)


def _tensor_from_bytes(
    buf: bytes | bytearray | memoryview, shape: tuple[int, ...], name: str
) -> torch.Tensor:
    expected = prod(shape) * ELEMENT_SIZE[name]
    if len(buf) != expected:
        raise bad_input(
            f"the body has {len(buf)} bytes; shape {list(shape)} of {name} needs {expected}",
            "wrong_shape",
        )
    if expected == 0:
        raise bad_input("the body has no elements", "empty_input")
    # bytes are read-only; torch.frombuffer warns on those, so give it a writable copy then.
    if not isinstance(buf, bytearray):
        buf = bytearray(buf)
    dtype = DTYPES[name]
    # torch.frombuffer: 1.10+; older torch goes through a ByteTensor
    t = (
        torch.frombuffer(buf, dtype=dtype)
        if compat.HAS_FROMBUFFER
        else torch.ByteTensor(list(buf)).view(dtype)
    )
    return t.reshape(shape)


def decode_npy(body: bytes | bytearray, expect: torch.dtype | None = None) -> torch.Tensor:
    """A .npy v1/v2/v3 file, C order, little-endian, without numpy. The header is at most
    NPY_MAX_HEADER bytes and must be exactly {'descr': str, 'fortran_order': bool, 'shape': tuple
    of ints}: literal_eval of anything else (deep nesting, huge numbers) is never attempted."""
    mv = memoryview(body)
    if len(body) < 10 or bytes(mv[:6]) != b"\x93NUMPY":
        raise bad_input("the body is not a .npy file (bad magic)", "malformed_npy")
    major = mv[6]
    if major == 1:
        (hlen,), start = struct.unpack("<H", mv[8:10]), 10
    elif major in (2, 3) and len(body) >= 12:
        (hlen,), start = struct.unpack("<I", mv[8:12]), 12
    else:
        raise bad_input(f".npy version {major} is not supported", "malformed_npy")
    if hlen > NPY_MAX_HEADER or start + hlen > len(body):
        raise bad_input(
            f"the .npy header length {hlen} is over {NPY_MAX_HEADER} bytes or past the body",
            "malformed_npy",
        )
    text = bytes(mv[start : start + hlen]).decode("latin1")
    if text.count("(") > 1 or text.count("[") or text.count("{") != 1:
        raise bad_input(
            "the .npy header is not {'descr': ..., 'fortran_order': ..., 'shape': (...)}",
            "malformed_npy",
        )
    try:
        header = ast.literal_eval(text)
        descr, fortran, shape = header["descr"], header["fortran_order"], header["shape"]
    except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError):
        raise bad_input("the .npy header cannot be parsed", "malformed_npy") from None
    if (
        not isinstance(descr, str)
        or not isinstance(fortran, bool)
        or not isinstance(shape, tuple)
        or len(shape) > 32
        or not all(type(d) is int and 0 <= d < 1 << 40 for d in shape)
    ):
        raise bad_input("the .npy header has a bad descr, fortran_order or shape", "malformed_npy")
    if fortran:
        raise bad_input(".npy arrays must be C-ordered (fortran_order=False)", "malformed_npy")
    name = _NPY_DTYPES.get(descr)
    if name is None:
        raise bad_input(
            f".npy dtype {descr[:20]!r} is not supported; use one of {', '.join(_NPY_DTYPES)}",
            "wrong_dtype",
        )
    _check_dtype(name, expect)
    return _tensor_from_bytes(mv[start + hlen :], shape, name)


def to_jsonable(outputs: Outputs, batched: bool) -> Any:
    if isinstance(outputs, torch.Tensor):
        return outputs.tolist() if batched else outputs[0].tolist()
    if isinstance(outputs, (tuple, list)):
        return [to_jsonable(o, batched) for o in outputs]
    return {k: to_jsonable(v, batched) for k, v in outputs.items()}


def encode_json(outputs: Outputs, batched: bool, non_finite_as_null: bool = False) -> bytes:
    """{"outputs": ...} as strict JSON. orjson writes NaN/Inf as null; unless that was asked
    for, non-finite outputs are refused first (the model failed, not the client)."""
    if not non_finite_as_null and non_finite(outputs):
        raise ApiError(
            500,
            "non_finite_output",
            "the model returned NaN or Inf values, which JSON cannot carry "
            "(config key non_finite_outputs: null writes them as null; or ask for application/octet-stream)",
        )
    return orjson.dumps({"outputs": to_jsonable(outputs, batched)})


def encode_raw(outputs: Outputs, batched: bool) -> tuple[bytes, dict[str, str]]:
    """Raw little-endian bytes of a single-tensor output, with X-Shape / X-Dtype headers."""
    if not isinstance(outputs, torch.Tensor):
        raise ApiError(
            406, "not_acceptable", "the model returns several tensors; ask for application/json"
        )
    t = outputs if batched else outputs[0]
    t = t.contiguous()
    name = DTYPE_NAMES.get(t.dtype, "float32")
    return _tensor_bytes(t), {"X-Shape": ",".join(map(str, t.shape)), "X-Dtype": name}


def _tensor_bytes(t: torch.Tensor) -> bytes:
    u8 = t.reshape(-1).view(torch.uint8)
    try:
        return u8.numpy().tobytes()
    except (RuntimeError, TypeError, ImportError):  # numpy missing or broken (torch 1.12 + numpy 2)
        return bytes(u8.tolist())


def dumps(doc: Any) -> bytes:
    """Any other JSON answer (errors, /v1/model, health)."""
    return orjson.dumps(doc)
