"""The torch side of the request codec: raw bytes (wire.py) to tensors and tensors to answers.

wire.py decodes JSON, raw (X-Shape / X-Dtype) and .npy bodies into raw little-endian bytes
without torch (an edge process runs it); `to_tensor` turns those bytes into the model's tensor
(a view, cast when the body travelled as a wider dtype) and refuses binary bodies that hold NaN
or Inf unless `allow_non_finite_inputs` (check_finite=False here). `decode` is both steps in one
process. Answers: `encode_json` / `encode_raw` in one process; `output_parts` gives the bytes,
dtype and shape of each output tensor for an edge process to encode (wire.encode_json).
A JSON answer whose outputs hold NaN/Inf is an `ApiError` 500 `non_finite_output` with
`non_finite_outputs: error` (the default) or carries `null` in their place with `null`: never a
bare NaN token. Every refusal is an `ApiError` (errors.py).
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson
import torch

from . import compat, v2, wire
from .errors import bad_input
from .tensors import DTYPE_NAMES, DTYPES, Outputs, non_finite
from .wire import JSON_TYPES, MEDIA_TYPES, Buffer, Decoded, OutputPart, Structure, dumps, media_type

__all__ = ["JSON_TYPES", "MEDIA_TYPES", "decode", "decode_npy", "dumps", "media_type", "to_tensor"]


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
    d = wire.decode(body, content_type, headers, input_shape, DTYPE_NAMES[dtype])
    return to_tensor(d, dtype, check_finite), d.batched


def to_tensor(d: Decoded, dtype: torch.dtype, check_finite: bool = True) -> torch.Tensor:
    """The decoded bytes as the model's tensor: a view of `d.data` when the dtypes agree (the
    caller keeps the buffer alive and unchanged while the tensor is used), else a cast copy."""
    t = _frombuffer(d.data, DTYPES[d.dtype]).reshape(d.shape)
    if t.dtype != dtype:
        t = t.to(dtype)
    if check_finite and d.binary and t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise bad_input(
            "the input holds NaN or Inf values (config key allow_non_finite_inputs)",
            "non_finite_input",
        )
    return t


def _frombuffer(buf: Buffer, dtype: torch.dtype) -> torch.Tensor:
    # bytes are read-only; torch.frombuffer warns on those, so give it a writable copy then.
    if isinstance(buf, bytes) or (isinstance(buf, memoryview) and buf.readonly):
        buf = bytearray(buf)
    # torch.frombuffer: 1.10+; older torch goes through a ByteTensor
    if compat.HAS_FROMBUFFER:
        return torch.frombuffer(buf, dtype=dtype)
    return torch.ByteTensor(list(buf)).view(dtype)


def decode_npy(body: bytes | bytearray, expect: torch.dtype | None = None) -> torch.Tensor:
    """A .npy file as a tensor (wire.decode_npy; sample inputs for warm-up)."""
    data, shape, name = wire.decode_npy(body, None if expect is None else DTYPE_NAMES[expect])
    return _frombuffer(data, DTYPES[name]).reshape(shape)


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
        raise wire.NON_FINITE_OUTPUT
    return orjson.dumps({"outputs": to_jsonable(outputs, batched)})


def encode_raw(outputs: Outputs, batched: bool) -> tuple[bytes, dict[str, str]]:
    """Raw little-endian bytes of a single-tensor output, with X-Shape / X-Dtype headers."""
    if not isinstance(outputs, torch.Tensor):
        raise wire.NOT_ACCEPTABLE
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


def output_parts(outputs: Outputs, for_json: bool) -> tuple[Structure, list[OutputPart], bool]:
    """-> (structure, parts, non_finite) of one request's outputs for an edge process: each
    tensor's bytes (float16 / bfloat16 as float32 for a JSON answer, which array cannot read),
    dtype name and shape; the structure names each part by its index (wire.Structure)."""
    parts: list[OutputPart] = []

    def walk(o: Outputs) -> Structure:
        if isinstance(o, torch.Tensor):
            t = o.detach().to("cpu").contiguous()
            if for_json and t.dtype in (torch.float16, torch.bfloat16):
                t = t.float()
            parts.append(
                OutputPart(_tensor_bytes(t), DTYPE_NAMES.get(t.dtype, "float32"), tuple(t.shape))
            )
            return len(parts) - 1
        if isinstance(o, (tuple, list)):
            return [walk(x) for x in o]
        return {str(k): walk(v) for k, v in o.items()}

    structure = walk(outputs)
    return structure, parts, bool(non_finite(outputs))


def output_card(outputs: Outputs) -> list[dict[str, Any]]:
    """The model card's outputs: each tensor's name (v2.output_names), dtype and shape without
    the batch dimension, from one batch's outputs (the self-test's)."""
    structure, parts, _ = output_parts(outputs, for_json=False)
    return [
        {"name": name, "dtype": p.dtype, "shape": list(p.shape[1:])}
        for name, p in zip(v2.output_names(structure), parts)
    ]
