#!/usr/bin/env python3
"""Request codec cost for one demo instance (3x64x64 float32): JSON vs raw vs .npy, best of 30.

    python benchmarks/codec_bench.py     (numpy is used only to build the .npy body)
"""

import io
import json
import time

import numpy as np
import torch
from torchfleet_runtime import codec

SHAPE = (3, 64, 64)


def best_ms(fn, n=30):
    fn()
    best = 1e9
    for _ in range(n):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def main():
    x = torch.randn(1, *SHAPE, generator=torch.Generator().manual_seed(0))
    body = json.dumps({"inputs": x.tolist()}).encode()
    raw = bytearray(x.numpy().tobytes())
    buf = io.BytesIO()
    np.save(buf, x.numpy())
    npy = buf.getvalue()
    headers = {"X-Shape": "1,3,64,64", "X-Dtype": "float32"}
    f32 = torch.float32
    print(f"JSON {len(body) / 1024:.0f} KiB: codec {best_ms(lambda: codec.decode(body, 'application/json', {}, SHAPE, f32)):.2f} ms;"
          f" json.loads + torch.tensor {best_ms(lambda: torch.tensor(json.loads(body)['inputs'])):.2f} ms;"
          f" json.loads alone {best_ms(lambda: json.loads(body)):.2f} ms")
    print(f"raw {len(raw) / 1024:.0f} KiB: {best_ms(lambda: codec.decode(raw, 'application/octet-stream', headers, SHAPE, f32)):.3f} ms;"
          f" .npy: {best_ms(lambda: codec.decode(npy, 'application/x-npy', {}, SHAPE, f32)):.3f} ms")
    out = torch.randn(1, 10)
    print(f"encode a JSON answer (10 logits): {best_ms(lambda: codec.encode_json(out, True)):.3f} ms")


if __name__ == "__main__":
    main()
