"""Tensor and bucket helpers: the leaf every other runtime module may import (it imports only torch).

- dtypes by name (`DTYPES`, `DTYPE_NAMES`) and the element size of each;
- model outputs (`Outputs`: one tensor, or a tuple/list/dict of tensors with the batch as dim 0):
  `split_outputs`, `concat_outputs`, `non_finite` (the JSON rule needs it);
- buckets, the batch sizes warm-up runs and the batcher pads to: `buckets_up_to`, `bucket_for`,
  and `make_batch` (n rows cycled from a sample).
"""

from __future__ import annotations

from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
ELEMENT_SIZE = {name: torch.empty((), dtype=dt).element_size() for name, dt in DTYPES.items()}

# Model outputs: one tensor, or a tuple/list/dict of tensors (each with the batch as dim 0).
Outputs = Any


def prod(dims: Any) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


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


def non_finite(outputs: Outputs) -> bool:
    """True when any floating-point tensor in `outputs` holds NaN or +-Inf."""
    if isinstance(outputs, torch.Tensor):
        return outputs.is_floating_point() and not bool(torch.isfinite(outputs).all())
    if isinstance(outputs, (tuple, list)):
        return any(non_finite(o) for o in outputs)
    if isinstance(outputs, dict):
        return any(non_finite(o) for o in outputs.values())
    return False


def buckets_up_to(cap: int) -> list[int]:
    """Powers of two below `cap`, then `cap` itself: 12 -> [1, 2, 4, 8, 12]."""
    out, b = [], 1
    while b < cap:
        out.append(b)
        b *= 2
    out.append(cap)
    return out


def bucket_for(n: int, buckets: list[int]) -> int:
    """The smallest bucket that holds n instances (n <= buckets[-1])."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} instances exceed the largest bucket {buckets[-1]}")


def make_batch(sample: torch.Tensor, n: int) -> torch.Tensor:
    """n rows, cycling through the rows of `sample`."""
    idx = torch.arange(n) % sample.shape[0]
    return sample.index_select(0, idx).contiguous()
