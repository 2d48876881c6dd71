"""The request codec without torch: bodies to raw little-endian bytes and back.

Contract. `decode(body, content_type, headers, input_shape, dtype_name)` turns a JSON, raw or
.npy body into a `Decoded`: the element bytes, the shape (N, *input_shape), the wire dtype name
and whether the client sent a batch; every refusal is an `ApiError` (errors.py) with the same
types and messages the runtime has always answered. `encode_json` / `encode_raw` turn an
answer's `OutputPart`s (bytes, dtype name, shape) back into a body. Only the standard library
and orjson: an edge process (edge.py) decodes and encodes with it, and codec.py (the owner's
torch side) builds on it, so each rule below lives here once.

Wire dtypes. Raw and .npy bodies travel as they came (any dtype of `ELEMENT_SIZE`). JSON
numbers become an `array.array` of the model's dtype where `array` has that type, else of a
wider one that holds every value exactly as the owner's cast expects: float16 and bfloat16
through float32, bool through int64 (the owner casts: codec.to_tensor).

Non-finite numbers: JSON cannot carry them (orjson refuses the literals); the owner checks
binary bodies with torch (codec.to_tensor), since a pass over the bytes here would cost more.
"""

from __future__ import annotations

import array
import ast
import itertools
import struct
from typing import Any, Mapping, NamedTuple, Sequence, Union

import orjson

from .errors import ApiError, bad_input

ELEMENT_SIZE = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "uint8": 1,
    "int8": 1,
    "bool": 1,
}
DTYPE_LIST = ", ".join(ELEMENT_SIZE)
# array.array typecodes for the dtypes JSON can carry exactly
ARRAY_CODES = {
    "float32": "f",
    "float64": "d",
    "int64": "q",
    "int32": "i",
    "uint8": "B",
    "int8": "b",
}
FLOATS = ("float32", "float16", "bfloat16", "float64")
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
Buffer = Union[bytes, bytearray, memoryview]


class Decoded(NamedTuple):
    """A decoded body: `data` holds prod(shape) elements of `dtype` (the wire dtype)."""

    data: Buffer
    shape: tuple[int, ...]
    dtype: str
    batched: bool
    binary: bool  # raw or .npy: the owner checks these for NaN/Inf


class OutputPart(NamedTuple):
    """One output tensor of one request: its bytes, dtype name and shape (rows first)."""

    data: Buffer
    dtype: str
    shape: tuple[int, ...]


# An answer's structure: a part's index, or a list / dict of structures (the model's outputs).
Structure = Union[int, Sequence[Any], Mapping[str, Any]]


def media_type(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


def prod(dims: Sequence[int]) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


def wire_dtype(dtype: str) -> str:
    """The dtype a JSON body of `dtype` travels as (see the module docstring)."""
    if dtype in ARRAY_CODES:
        return dtype
    return "float32" if dtype in FLOATS else "int64"


def decode(
    body: bytes | bytearray,
    content_type: str,
    headers: Mapping[str, str],
    input_shape: tuple[int, ...],
    dtype: str,
) -> Decoded:
    """The body as raw bytes shaped (N, *input_shape); `headers` maps lower-case names to values
    (X-Shape/X-Dtype for raw bodies)."""
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
        data, shape, name = decode_json(body, dtype)
        binary = False
    elif ctype == "application/octet-stream":
        data, shape, name = decode_raw(body, headers.get("x-shape"), headers.get("x-dtype"), dtype)
        binary = True
    else:
        data, shape, name = decode_npy(body, dtype)
        binary = True
    full, batched = check_shape(shape, input_shape)
    return Decoded(data, full, name, batched, binary)


def check_shape(
    shape: tuple[int, ...], input_shape: tuple[int, ...]
) -> tuple[tuple[int, ...], bool]:
    """-> (shape with the batch dim, batched) where batched=False means one bare instance."""
    if shape == input_shape:
        return (1, *shape), False
    if len(shape) == len(input_shape) + 1 and shape[1:] == input_shape:
        if shape[0] == 0:
            raise bad_input("the batch has no instances", "empty_input")
        return shape, True
    want = ",".join(map(str, input_shape))
    raise bad_input(
        f"input shape {list(shape)} does not match the model: expected [{want}] for one "
        f"instance or [N,{want}] for a batch",
        "wrong_shape",
    )


def decode_json(body: bytes | bytearray, dtype: str) -> tuple[Buffer, tuple[int, ...], str]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:  # also invalid UTF-8, NaN literals, nesting > 1024
        raise bad_input(f"the body is not valid JSON ({exc})", "malformed_json") from None
    if not isinstance(doc, dict) or "inputs" not in doc:
        raise bad_input('expected a JSON object {"inputs": [...]}', "malformed_json")
    return json_values(doc["inputs"], dtype, "'inputs'")


def json_values(data: Any, dtype: str, what: str) -> tuple[Buffer, tuple[int, ...], str]:
    """A (nested) JSON list of numbers as the bytes of `dtype`'s wire dtype and its nested shape;
    `what` names the field in refusals (the /v1 body's 'inputs', a /v2 input's data)."""
    if not isinstance(data, list):
        raise bad_input(
            f"{what} must be a (nested) list of numbers",
            "wrong_dtype" if data is not None else "empty_input",
        )
    if not data:
        raise bad_input(f"{what} is empty", "empty_input")
    shape = [len(data)]
    level: list[Any] = data
    # Flatten one nesting level at a time, checking every sub-list has the same length.
    while isinstance(level[0], list):
        n = len(level[0])
        try:
            if any(len(x) != n for x in level):
                raise bad_input(
                    f"{what} is ragged: sub-lists at one depth differ in length", "wrong_shape"
                )
        except TypeError:  # a number (or a string, an object) where a list was expected
            raise bad_input(f"{what} mixes numbers and lists at one depth", "wrong_shape") from None
        if n == 0:
            raise bad_input(f"{what} contains an empty list", "empty_input")
        shape.append(n)
        level = list(itertools.chain.from_iterable(level))
    name = wire_dtype(dtype)
    try:
        arr = array.array(ARRAY_CODES[name], level)
    except (TypeError, OverflowError, ValueError) as exc:
        kind = "numbers" if dtype in FLOATS else f"integers fitting {dtype}"
        raise bad_input(f"{what} must contain only {kind} ({exc})", "wrong_dtype") from None
    return memoryview(arr).cast("B"), tuple(shape), name


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


def check_dtype(name: str, expect: str | None) -> None:
    if expect is not None and name != expect:
        raise bad_input(f"dtype {name} does not match the model's {expect}", "wrong_dtype")


def decode_raw(
    body: bytes | bytearray,
    shape_header: str | None,
    dtype_header: str | None,
    expect: str | None = None,
) -> tuple[Buffer, tuple[int, ...], str]:
    shape = _parse_shape(shape_header)
    if not dtype_header:
        raise bad_input("a binary body needs an X-Dtype header such as float32", "missing_header")
    name = dtype_header.strip().lower()
    if name not in ELEMENT_SIZE:
        raise bad_input(f"X-Dtype {dtype_header[:40]!r} is not one of {DTYPE_LIST}", "wrong_dtype")
    check_dtype(name, expect)
    return check_size(body, shape, name), shape, name


def check_size(buf: Buffer, shape: tuple[int, ...], name: str) -> Buffer:
    expected = prod(shape) * ELEMENT_SIZE[name]
    if len(buf) != expected:
        raise bad_input(
            f"the body has {len(buf)} bytes; shape {list(shape)} of {name} needs {expected}",
            "wrong_shape",
        )
    if expected == 0:
        raise bad_input("the body has no elements", "empty_input")
    return buf


def decode_npy(
    body: bytes | bytearray, expect: str | None = None
) -> tuple[Buffer, tuple[int, ...], str]:
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
    check_dtype(name, expect)
    return check_size(mv[start + hlen :], shape, name), shape, name


# --- answers -----------------------------------------------------------------------------------

NON_FINITE_OUTPUT = ApiError(
    500,
    "non_finite_output",
    "the model returned NaN or Inf values, which JSON cannot carry "
    "(config key non_finite_outputs: null writes them as null; or ask for application/octet-stream)",
)


def _nested(flat: list[Any], shape: tuple[int, ...]) -> Any:
    """`flat` (row-major) as nested lists of `shape`."""
    out = flat
    for dim in reversed(shape[1:]):
        out = [out[i : i + dim] for i in range(0, len(out), dim)]
    return out


def part_values(part: OutputPart, batched: bool) -> Any:
    """The part as nested lists (the first row alone when the client sent one instance)."""
    rows = _nested(flat_values(part.data, part.dtype), part.shape)
    return rows if batched else rows[0]


def flat_values(data: Buffer, dtype: str) -> list[Any]:
    """Little-endian elements of `dtype` as Python numbers (bools for bool). float16 through
    struct's half format; bfloat16 is the top half of a float32, so it widens exactly."""
    if dtype == "float16":
        return list(struct.unpack(f"<{len(data) // 2}e", data))
    if dtype == "bfloat16":
        halves = array.array("H")
        halves.frombytes(data)
        widened = array.array("I", (h << 16 for h in halves))
        return array.array("f", widened.tobytes()).tolist()
    arr = array.array(ARRAY_CODES.get(dtype, "B"))  # bool travels as one byte
    arr.frombytes(data)
    flat: list[Any] = arr.tolist()
    return [bool(x) for x in flat] if dtype == "bool" else flat


def jsonable(structure: Structure, parts: Sequence[OutputPart], batched: bool) -> Any:
    if isinstance(structure, int):
        return part_values(parts[structure], batched)
    if isinstance(structure, Mapping):
        return {k: jsonable(v, parts, batched) for k, v in structure.items()}
    return [jsonable(s, parts, batched) for s in structure]


def encode_json(
    structure: Structure,
    parts: Sequence[OutputPart],
    batched: bool,
    non_finite: bool,
    as_null: bool,
) -> bytes:
    """{"outputs": ...} as strict JSON (orjson writes NaN/Inf as null: refused first unless
    `as_null`, see codec.encode_json)."""
    if non_finite and not as_null:
        raise NON_FINITE_OUTPUT
    return orjson.dumps({"outputs": jsonable(structure, parts, batched)})


NOT_ACCEPTABLE = ApiError(
    406, "not_acceptable", "the model returns several tensors; ask for application/json"
)


def encode_raw(part: OutputPart, batched: bool) -> tuple[bytes, dict[str, str]]:
    """Raw little-endian bytes of a single-tensor output, with X-Shape / X-Dtype headers."""
    shape = part.shape
    data = part.data
    if not batched:
        row = len(data) // shape[0] if shape[0] else 0
        data, shape = data[:row], shape[1:]
    return bytes(data), {"X-Shape": ",".join(map(str, shape)), "X-Dtype": part.dtype}


def wants_raw(accept: str) -> bool:
    return "application/octet-stream" in accept and "application/json" not in accept


def dumps(doc: Any) -> bytes:
    """Any other JSON answer (errors, /v1/model, health)."""
    return orjson.dumps(doc)
