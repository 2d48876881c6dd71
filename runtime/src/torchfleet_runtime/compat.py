"""Feature flags per torch version: the runtime must run on torch 1.12.1 and on torch 2.x.

Every version-dependent torch API the runtime touches is resolved here, once, so the rest of the
code reads the same on both stacks (TorchServe's base_handler does the same per-version dance
inline; keeping it in one module makes the supported range auditable).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, ContextManager

import torch

# torch.inference_mode: 1.9+. Older torch falls back to no_grad (same numerics, a bit slower).
inference_mode: Callable[[], ContextManager[Any]] = getattr(torch, "inference_mode", torch.no_grad)

# torch.autocast(device_type=...): 1.10+. CPU autocast supports bfloat16 only.
HAS_AUTOCAST = hasattr(torch, "autocast")

# torch.frombuffer: 1.10+. Used to turn request bytes into a tensor without numpy.
HAS_FROMBUFFER = hasattr(torch, "frombuffer")


def _cuda_graphs() -> tuple[str, dict[str, Any]]:
    """Why graphs.py must not capture on this torch ("" when it may), and the capture's extra
    arguments. torch.cuda.CUDAGraph and the torch.cuda.graph context (with `pool`) exist from
    1.10, so 1.12 has them; but before `capture_error_mode` (2.1) a capture runs in CUDA's
    global mode, where a CUDA call from any other thread of the process (another replica
    warming, the old model serving during a reload) fails while the capture runs."""
    if not (hasattr(torch.cuda, "CUDAGraph") and hasattr(torch.cuda, "graph")):
        return f"torch {torch.__version__} has no CUDA graphs", {}
    try:
        params = inspect.signature(torch.cuda.graph.__init__).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    if "capture_error_mode" not in params:
        return (
            f"torch {torch.__version__} captures CUDA graphs in global mode only (other "
            "threads' CUDA calls would fail during a capture)",
            {},
        )
    return "", {"capture_error_mode": "thread_local"}


CUDA_GRAPHS_WHY_NOT, CUDA_GRAPH_CAPTURE_ARGS = _cuda_graphs()

# Tensor.untyped_storage: 2.0+; 1.12 has Tensor.storage() (deprecated in 2.x).
_HAS_UNTYPED_STORAGE = hasattr(torch.Tensor, "untyped_storage")


def storage_span(t: torch.Tensor) -> tuple[int, int]:
    """The address range [start, end) of the memory `t`'s storage owns (views share it)."""
    s = t.untyped_storage() if _HAS_UNTYPED_STORAGE else t.storage()
    size = s.nbytes() if _HAS_UNTYPED_STORAGE else s.size() * t.element_size()
    return s.data_ptr(), s.data_ptr() + size


# torch.cuda.OutOfMemoryError: 2.0+ (a RuntimeError subclass). 1.12 raises a plain RuntimeError
# whose message contains "out of memory".
_OOM_CLASS = getattr(torch.cuda, "OutOfMemoryError", None)


def is_oom(exc: BaseException) -> bool:
    """True when `exc` is a CUDA (or CPU allocator) out-of-memory error on any torch version."""
    if _OOM_CLASS is not None and isinstance(exc, _OOM_CLASS):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


# Sticky CUDA errors: the context is corrupted and every later call on the device fails too
# (a GPU that fell off the bus, an uncorrectable ECC error, an illegal access in a kernel). Torch
# 1.12 and 2.x both raise them as RuntimeError "CUDA error: <cudaGetErrorString>" (2.x may
# prefix "CUDA error: " with context but keeps the phrase); an OOM is not one of them.
_DEVICE_LOST = (
    "CUDA error: an illegal memory access",
    "CUDA error: unspecified launch failure",
    "CUDA error: uncorrectable ECC error",
    "CUDA error: GPU is lost",
    "CUDA error: misaligned address",
    "CUDA error: an illegal instruction",
    "CUDA error: device-side assert triggered",
    "CUDA error: unknown error",
)


def is_device_lost(exc: BaseException) -> bool:
    """True when `exc` says the replica's CUDA device can serve no more (see _DEVICE_LOST)."""
    if not isinstance(exc, RuntimeError) or is_oom(exc):
        return False
    text = str(exc)
    return any(phrase in text for phrase in _DEVICE_LOST)


def autocast(
    device_type: str, dtype: torch.dtype | None, cache: bool = True
) -> ContextManager[Any]:
    """Autocast for `device_type` at `dtype`, or a no-op when dtype is None (fp32). `cache`
    False while capturing a CUDA graph: PyTorch's CUDA-graph notes require autocast's cast
    cache off there (cached casts would be freed behind the graph's back)."""
    if dtype is None:
        return contextlib.nullcontext()
    if not HAS_AUTOCAST:  # torch < 1.10: only CUDA autocast, fp16 only
        if device_type == "cuda" and dtype == torch.float16:
            return torch.cuda.amp.autocast()
        raise RuntimeError(f"torch {torch.__version__} has no autocast for {device_type}/{dtype}")
    return torch.autocast(device_type=device_type, dtype=dtype, cache_enabled=cache)


def dispatcher_autocast_for_torchscript() -> None:
    """Let autocast reach TorchScript graphs through the dispatcher, as it does in eager mode.

    torch 1.12's JIT autocast pass fails on CPU bf16 ("UNSUPPORTED DTYPE", seen with the demo
    model); with the pass off, each op the TorchScript interpreter runs still goes through the
    autocast dispatch key, which gives the same casts on 1.12 and 2.x.
    """
    setter = getattr(torch._C, "_jit_set_autocast_mode", None)
    if setter is not None:
        setter(False)


def cuda_empty_cache() -> None:
    """Return cached blocks to the driver; safe to call when CUDA was never initialised."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def bf16_supported_on_cuda() -> bool:
    fn = getattr(torch.cuda, "is_bf16_supported", None)
    return bool(fn and torch.cuda.is_available() and fn())
