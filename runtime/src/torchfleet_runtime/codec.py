"""Request decoding and response encoding, with no numpy on the request path.

Three request forms reach the model as one tensor shaped (N, *input_shape):
- JSON `{"inputs": nested list}`, one instance or a batch. json.loads is the only parse; the
  nested lists are flattened level by level in C (itertools.chain) into an `array.array`, which
  torch wraps without another per-element pass. This is ~25 % cheaper than torch.tensor(nested)
  and checks raggedness as it goes.
- `application/octet-stream`: raw little-endian bytes with X-Shape and X-Dtype headers.
- `application/x-npy`: a .npy file (header parsed here, so numpy need not be installed or working:
  torch 1.12 with numpy 2 cannot convert at all).
Byte order is little-endian, as on every x86-64 and arm64 node.
Errors are `RequestError(status, type, message)`; the server turns them into JSON 4xx answers.
"""

from __future__ import annotations

import array
import ast
import itertools
import json
import struct
from typing import Any

import torch

from . import compat
from .model import DTYPE_NAMES, DTYPES, Outputs

# array.array typecodes for the dtypes JSON can carry exactly; others go through float32/int64.
_ARRAY_CODES = {torch.float32: "f", torch.float64: "d", torch.int64: "q", torch.int32: "i",
                torch.uint8: "B", torch.int8: "b"}
_NPY_DTYPES = {"<f4": "float32", "<f8": "float64", "<f2": "float16", "<i8": "int64", "<i4": "int32",
               "|u1": "uint8", "|i1": "int8", "|b1": "bool"}
_ELEMENT_SIZE = {name: torch.empty((), dtype=dt).element_size() for name, dt in DTYPES.items()}


class RequestError(Exception):
    def __init__(self, status: int, type_: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message


def _bad(message: str, type_: str = "invalid_input") -> RequestError:
    return RequestError(400, type_, message)


def decode(body: bytes | bytearray, content_type: str, headers: Any,
           input_shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, bool]:
    """-> (tensor shaped (N, *input_shape), batched) where batched=False means one bare instance."""
    ctype = content_type.split(";")[0].strip().lower()
    if not body:
        raise _bad("the request body is empty", "empty_input")
    if ctype in ("application/json", ""):
        tensor = decode_json(body, dtype)
    elif ctype == "application/octet-stream":
        tensor = decode_raw(body, headers.get("X-Shape"), headers.get("X-Dtype"), dtype)
    elif ctype == "application/x-npy":
        tensor = decode_npy(body, dtype)
    else:
        raise RequestError(415, "unsupported_media_type",
                           f"Content-Type {ctype!r} is not supported; use application/json, "
                           "application/octet-stream (with X-Shape and X-Dtype) or application/x-npy")
    return _check_shape(tensor, input_shape)


def _check_shape(tensor: torch.Tensor, input_shape: tuple[int, ...]) -> tuple[torch.Tensor, bool]:
    shape = tuple(tensor.shape)
    if shape == input_shape:
        return tensor.unsqueeze(0), False
    if len(shape) == len(input_shape) + 1 and shape[1:] == input_shape:
        if shape[0] == 0:
            raise _bad("the batch has no instances", "empty_input")
        return tensor, True
    want = ",".join(map(str, input_shape))
    raise _bad(f"input shape {list(shape)} does not match the model: expected [{want}] for one "
               f"instance or [N,{want}] for a batch", "wrong_shape")


def decode_json(body: bytes | bytearray, dtype: torch.dtype) -> torch.Tensor:
    try:
        doc = json.loads(body)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise _bad(f"the body is not valid JSON ({exc})", "malformed_json") from None
    if not isinstance(doc, dict) or "inputs" not in doc:
        raise _bad('expected a JSON object {"inputs": [...]}', "malformed_json")
    data = doc["inputs"]
    if not isinstance(data, list):
        raise _bad("'inputs' must be a (nested) list of numbers", "wrong_dtype" if data is not None else "empty_input")
    if not data:
        raise _bad("'inputs' is empty", "empty_input")
    shape = [len(data)]
    level: list[Any] = data
    # Flatten one nesting level at a time, checking every sub-list has the same length.
    while isinstance(level[0], list):
        n = len(level[0])
        try:
            if any(len(x) != n for x in level):
                raise _bad("'inputs' is ragged: sub-lists at one depth differ in length", "wrong_shape")
        except TypeError:  # a number where a list was expected
            raise _bad("'inputs' mixes numbers and lists at one depth", "wrong_shape") from None
        if n == 0:
            raise _bad("'inputs' contains an empty list", "empty_input")
        shape.append(n)
        level = list(itertools.chain.from_iterable(level))
    return _flat_to_tensor(level, shape, dtype)


def _prod(dims: list[int]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def _flat_to_tensor(flat: list[Any], shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    code = _ARRAY_CODES.get(dtype)
    try:
        if code is not None:
            arr = array.array(code, flat)
            t = torch.frombuffer(arr, dtype=dtype) if compat.HAS_FROMBUFFER else torch.tensor(arr, dtype=dtype)
        else:  # float16 / bfloat16 / bool: via a wide type, then cast
            t = torch.tensor(flat, dtype=torch.float32 if dtype.is_floating_point else torch.int64).to(dtype)
    except (TypeError, OverflowError, ValueError) as exc:
        kind = "numbers" if dtype.is_floating_point else f"integers fitting {DTYPE_NAMES[dtype]}"
        raise _bad(f"'inputs' must contain only {kind} ({exc})", "wrong_dtype") from None
    return t.reshape(shape)


def _parse_shape(text: str | None) -> tuple[int, ...]:
    if not text:
        raise _bad("a binary body needs an X-Shape header such as 4,3,64,64", "missing_header")
    try:
        dims = tuple(int(p) for p in text.replace(" ", "").split(",") if p)
    except ValueError:
        raise _bad(f"X-Shape {text!r} is not a comma-separated list of integers", "wrong_shape") from None
    if not dims or any(d < 0 for d in dims):
        raise _bad(f"X-Shape {text!r} is not a list of non-negative integers", "wrong_shape")
    return dims


def _check_dtype(name: str, expect: torch.dtype | None) -> None:
    if expect is not None and DTYPES[name] != expect:
        raise _bad(f"dtype {name} does not match the model's {DTYPE_NAMES[expect]}", "wrong_dtype")


def decode_raw(body: bytes | bytearray, shape_header: str | None, dtype_header: str | None,
               expect: torch.dtype | None = None) -> torch.Tensor:
    shape = _parse_shape(shape_header)
    if not dtype_header:
        raise _bad("a binary body needs an X-Dtype header such as float32", "missing_header")
    name = dtype_header.strip().lower()
    if name not in DTYPES:
        raise _bad(f"X-Dtype {dtype_header!r} is not one of {', '.join(DTYPES)}", "wrong_dtype")
    _check_dtype(name, expect)
    return _tensor_from_bytes(body, shape, name)


def _tensor_from_bytes(buf: bytes | bytearray | memoryview, shape: tuple[int, ...], name: str) -> torch.Tensor:
    expected = _prod(list(shape)) * _ELEMENT_SIZE[name]
    if len(buf) != expected:
        raise _bad(f"the body has {len(buf)} bytes; shape {list(shape)} of {name} needs {expected}", "wrong_shape")
    if expected == 0:
        raise _bad("the body has no elements", "empty_input")
    # bytes are read-only; torch.frombuffer warns on those, so give it a writable copy then.
    if not isinstance(buf, bytearray):
        buf = bytearray(buf)
    dtype = DTYPES[name]
    if compat.HAS_FROMBUFFER:
        t = torch.frombuffer(buf, dtype=dtype)
    else:  # torch < 1.10
        t = torch.ByteTensor(list(buf)).view(dtype)
    return t.reshape(shape)


def decode_npy(body: bytes | bytearray, expect: torch.dtype | None = None) -> torch.Tensor:
    """A .npy v1/v2/v3 file, C order, little-endian, without numpy."""
    mv = memoryview(body)
    if bytes(mv[:6]) != b"\x93NUMPY" or len(body) < 10:
        raise _bad("the body is not a .npy file (bad magic)", "malformed_npy")
    major = mv[6]
    if major == 1:
        (hlen,), start = struct.unpack("<H", mv[8:10]), 10
    elif major in (2, 3):
        (hlen,), start = struct.unpack("<I", mv[8:12]), 12
    else:
        raise _bad(f".npy version {major} is not supported", "malformed_npy")
    try:
        header = ast.literal_eval(bytes(mv[start:start + hlen]).decode("latin1"))
        descr, fortran, shape = header["descr"], header["fortran_order"], tuple(header["shape"])
    except (ValueError, SyntaxError, KeyError, TypeError):
        raise _bad("the .npy header cannot be parsed", "malformed_npy") from None
    if fortran:
        raise _bad(".npy arrays must be C-ordered (fortran_order=False)", "malformed_npy")
    name = _NPY_DTYPES.get(descr)
    if name is None:
        raise _bad(f".npy dtype {descr!r} is not supported; use one of {', '.join(_NPY_DTYPES)}", "wrong_dtype")
    _check_dtype(name, expect)
    return _tensor_from_bytes(mv[start + hlen:], shape, name)


def split_outputs(outputs: Outputs, start: int, stop: int) -> Outputs:
    """Rows start:stop of every tensor in `outputs` (the batch is dim 0)."""
    if isinstance(outputs, torch.Tensor):
        return outputs[start:stop]
    if isinstance(outputs, (tuple, list)):
        return type(outputs)(split_outputs(o, start, stop) for o in outputs)
    return {k: split_outputs(v, start, stop) for k, v in outputs.items()}


def concat_outputs(parts: list[Outputs]) -> Outputs:
    first = parts[0]
    if len(parts) == 1:
        return first
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if isinstance(first, (tuple, list)):
        return type(first)(concat_outputs([p[i] for p in parts]) for i in range(len(first)))
    return {k: concat_outputs([p[k] for p in parts]) for k in first}


def to_jsonable(outputs: Outputs, batched: bool) -> Any:
    if isinstance(outputs, torch.Tensor):
        return outputs.tolist() if batched else outputs[0].tolist()
    if isinstance(outputs, (tuple, list)):
        return [to_jsonable(o, batched) for o in outputs]
    return {k: to_jsonable(v, batched) for k, v in outputs.items()}


def encode_json(outputs: Outputs, batched: bool) -> bytes:
    return json.dumps({"outputs": to_jsonable(outputs, batched)}, separators=(",", ":")).encode()


def encode_raw(outputs: Outputs, batched: bool) -> tuple[bytes, dict[str, str]]:
    """Raw little-endian bytes of a single-tensor output, with X-Shape / X-Dtype headers."""
    if not isinstance(outputs, torch.Tensor):
        raise RequestError(406, "not_acceptable", "the model returns several tensors; ask for application/json")
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
