"""Loading a model (TorchScript, eager factory + state_dict, ONNX) and running one batch of it.

`load(config)` returns a `LoadedModel`: metadata (what one instance looks like) and a `Predictor`
whose `__call__(batch) -> outputs` is the only thing the batcher and warm-up see. The predictor
owns device placement, precision (autocast) and inference_mode, so callers never repeat them.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torchfleet_compat.model_version import model_version
from torchfleet_compat.problems import sentence

from . import compat
from .config import FIELDS, Config, ConfigError
from .tensors import DTYPE_NAMES, DTYPES, Outputs

__all__ = [
    "DTYPES",
    "DTYPE_NAMES",
    "LoadedModel",
    "Metadata",
    "ModelError",
    "Outputs",
    "Predictor",
    "check_model_file",
    "load",
]

log = logging.getLogger(__name__)


class ModelError(RuntimeError):
    """The model or its metadata cannot be loaded."""


@dataclass
class Metadata:
    """What one instance looks like, from the sidecar JSON, overridden by config flags."""

    input_shape: tuple[int, ...]
    dtype: str = "float32"
    name: str = "model"
    output_description: str = ""
    version: str = ""  # the sidecar's "version"; empty: load() uses the model file's sha256
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.extra)
        out.update(
            name=self.name,
            input_shape=list(self.input_shape),
            dtype=self.dtype,
            output_description=self.output_description,
        )
        if self.version:
            out["version"] = self.version
        return out


def metadata_path(config: Config) -> Path | None:
    if config.metadata:
        return Path(config.metadata)
    if config.model:
        candidate = Path(config.model).with_suffix(".json")
        if candidate.is_file():
            return candidate
    return None


def load_metadata(config: Config) -> Metadata:
    data: dict[str, Any] = {}
    path = metadata_path(config)
    if path is not None:
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise ModelError(f"metadata {path}: cannot read ({exc.strerror})") from None
        except ValueError as exc:
            raise ModelError(f"metadata {path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ModelError(f"metadata {path}: expected a JSON object")
    shape = config.input_shape or data.get("input_shape")
    if not shape:
        raise ModelError(
            "the input shape is unknown: give a metadata sidecar with 'input_shape' "
            "(MODEL.json or --metadata) or --input-shape such as 3,64,64"
        )
    try:
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise ModelError(
            f"metadata {path}: 'input_shape' must be a list of integers, got {shape!r}"
        ) from None
    dtype = config.dtype or data.get("dtype", "float32")
    if dtype not in DTYPES:
        raise ModelError(f"metadata {path}: 'dtype' {dtype!r} is not one of {', '.join(DTYPES)}")
    known = {"input_shape", "dtype", "name", "output_description", "version"}
    version = data.get("version", "")
    if (
        not isinstance(version, (str, int, float))
        or isinstance(version, bool)
        or len(str(version)) > 128
    ):
        raise ModelError(
            f"metadata {path}: 'version' must be a short string such as \"2026-12-01.1\", got {version!r}"
        )
    return Metadata(
        input_shape=shape,
        dtype=dtype,
        name=str(data.get("name") or Path(config.model or "model").stem),
        output_description=str(data.get("output_description", "")),
        version=str(version),
        extra={k: v for k, v in data.items() if k not in known},
    )


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(sentence("device", spec, "auto, cpu", why="CUDA is not available"))
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(
                sentence(
                    "device",
                    spec,
                    f"auto, cpu, cuda, cuda:0..cuda:{count - 1}",
                    why=f"only {count} CUDA device(s) exist",
                )
            )
    return device


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `precision` on `device` (None = plain fp32), or a clear error."""
    if precision == "fp32":
        return None
    if precision == "fp16":
        if device.type != "cuda":
            raise ConfigError(
                sentence("precision", precision, "fp32, bf16", why="fp16 needs a CUDA device")
            )
        return torch.float16
    if device.type == "cuda" and not compat.bf16_supported_on_cuda():
        raise ConfigError(
            sentence("precision", precision, "fp32, fp16", why="bf16 needs sm_80+ on a GPU")
        )
    if not compat.HAS_AUTOCAST:
        raise ConfigError(
            sentence(
                "precision",
                precision,
                "fp32",
                why=f"bf16 needs torch >= 1.10, not {torch.__version__}",
            )
        )
    return torch.bfloat16


class Predictor:
    """Runs one batch: moves it to the device, applies precision, returns outputs on the CPU."""

    def __init__(
        self,
        fn: Callable[[torch.Tensor], Outputs],
        device: torch.device,
        amp_dtype: torch.dtype | None,
        uses_torch: bool = True,
    ) -> None:
        self._fn = fn
        self.device = device
        self.amp_dtype = amp_dtype
        self._uses_torch = uses_torch

    @property
    def uses_torch(self) -> bool:
        """False for ONNX: its session places and runs the batch itself (no device tensors)."""
        return self._uses_torch

    def __call__(self, batch: torch.Tensor) -> Outputs:
        return self.fetch(self.launch(batch))

    def launch(self, batch: torch.Tensor, capturing: bool = False) -> Outputs:
        """Start one batch: its outputs on the device, queued on the current CUDA stream and not
        waited for (on CPU, computed). The batch travels at the model's input dtype; autocast
        casts on the device. `capturing`: inside a CUDA graph capture (graphs.py)."""
        if not self._uses_torch:  # ONNX: the session handles device and precision itself
            return self._fn(batch)
        with compat.inference_mode(), compat.autocast(
            self.device.type, self.amp_dtype, cache=not capturing
        ):
            return self._fn(batch.to(self.device, non_blocking=True))

    def fetch(self, out: Outputs) -> Outputs:
        """`launch`'s outputs on the CPU (waits for the device), half precisions as float32."""
        return _to_cpu(out) if self._uses_torch else out


def _to_cpu(out: Outputs) -> Outputs:
    if isinstance(out, torch.Tensor):
        # Half/bfloat16 logits go back as float32: JSON and most clients expect it.
        if out.dtype in (torch.float16, torch.bfloat16):
            out = out.float()
        return out.cpu()
    if isinstance(out, (tuple, list)):
        return type(out)(_to_cpu(o) for o in out)
    if isinstance(out, dict):
        return {k: _to_cpu(v) for k, v in out.items()}
    raise ModelError(
        f"the model returned {type(out).__name__}; expected a tensor or a tuple/list/dict of tensors"
    )


@dataclass
class LoadedModel:
    metadata: Metadata
    predictor: Predictor
    format: str
    device: torch.device
    module: Any = None  # the torch module (None for ONNX), for tests and introspection
    version: str = ""  # metadata's version, else "sha256:<12 hex>" of the model file, else "module"
    optimization: dict[str, Any] = field(default_factory=dict)  # what optimize.py did, and why


def _versioned(loaded: LoadedModel, config: Config) -> LoadedModel:
    loaded.version = model_version(loaded.metadata.version, config.model)
    return loaded


def detect_format(config: Config) -> str:
    if config.model_format != "auto":
        return config.model_format
    if config.factory:
        return "eager"
    if str(config.model).endswith(".onnx"):
        return "onnx"
    return "torchscript"


def load(config: Config, module: Any = None, device: torch.device | None = None) -> LoadedModel:
    """Load the model named by `config` (or wrap `module`, an already built nn.Module) onto
    `device` (None: `config.device` resolved)."""
    return _versioned(_load(config, module, device), config)


MODEL_SUFFIXES = (
    ".pt",
    ".pth",
    ".ts",
    ".jit",
    ".onnx",
    ".bin",
)  # what a model file is likely named


def _in_container() -> bool:
    # podman writes /run/.containerenv, docker /.dockerenv; systemd-nspawn and podman set $container
    markers = ("/run/.containerenv", "/.dockerenv")
    return bool(os.environ.get("container")) or any(os.path.exists(p) for p in markers)  # noqa: SIM112 (its real name)


def check_model_file(path: str) -> None:
    """Fail with what is wrong and how to fix it when `path` is not a readable file: the first
    mistake of a container user is a model that was never mounted at the configured path."""
    p = Path(path)
    how = "point --model, TORCHFLEET_MODEL or the config file's 'model:' at the model file"
    if p.is_file():
        if not os.access(p, os.R_OK):
            raise ModelError(
                f"config key 'model': {path}: permission denied for uid {os.getuid()}; "
                "make the file (and its directories) readable by that user"
            )
        return
    home = p if p.is_dir() else p.parent  # the directory that should hold the model
    what = (
        f"config key 'model': {path} is a directory, not a model file"
        if p.is_dir()
        else f"config key 'model': model file not found: {path}"
    )
    where = home
    while not where.is_dir() and where != where.parent:
        where = where.parent
    try:
        names = sorted(
            c.name for c in where.iterdir() if c.suffix in MODEL_SUFFIXES and c.is_file()
        )
    except OSError:
        names = []
    if names:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        found = f"{where} holds {shown}: {how} (e.g. TORCHFLEET_MODEL={where / names[0]})"
    else:
        found = f"{home} {'holds no model file' if where == home else 'does not exist'}; {how}"
        if _in_container():
            found += (
                f", or mount the model's directory at {home} (podman/docker run -v DIR:{home}:ro)"
            )
    raise ModelError(f"{what} ({found})")


def _load(config: Config, module: Any = None, device: torch.device | None = None) -> LoadedModel:
    if module is None:
        if not config.model:
            raise ConfigError(sentence("model", None, FIELDS["model"].allowed))
        check_model_file(config.model)  # before the sidecar: its absence is a symptom of this
    metadata = load_metadata(config)
    device = resolve_device(config.device) if device is None else device
    amp = autocast_dtype(config.precision, device)
    if module is not None:
        fmt = "module"
    else:
        assert config.model  # checked at the top: no module given means a model file
        fmt = detect_format(config)
        if fmt == "onnx":
            return _load_onnx(config, metadata, device)
        module = (
            _load_torchscript(config.model, device)
            if fmt == "torchscript"
            else _load_eager(config, config.model, device)
        )
        if fmt == "torchscript" and amp is not None:
            compat.dispatcher_autocast_for_torchscript()
    module = module.to(device).eval()
    return LoadedModel(metadata, Predictor(module, device, amp), fmt, device, module)


def _load_torchscript(path: str, device: torch.device) -> Any:
    try:
        return torch.jit.load(path, map_location=device)
    except RuntimeError as exc:
        raise ModelError(
            f"config key 'model': {path!r} is not a TorchScript archive ({str(exc).splitlines()[0]}); "
            "for a state_dict give --factory pkg.module:function"
        ) from None


def import_factory(spec: str) -> Callable[[], Any]:
    mod_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ModelError(
            f"config key 'factory': cannot import module {mod_name!r} ({exc})"
        ) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ModelError(
                f"config key 'factory': module {mod_name!r} has no attribute {attr!r}"
            ) from None
    if not callable(obj):
        raise ModelError(f"config key 'factory': {spec!r} is not callable")
    return obj


def _load_eager(config: Config, path: str, device: torch.device) -> Any:
    factory = import_factory(str(config.factory))
    module = factory()
    if not isinstance(module, torch.nn.Module):
        raise ModelError(
            f"config key 'factory': {config.factory!r} returned {type(module).__name__}, not an nn.Module"
        )
    try:
        state = torch.load(path, map_location="cpu")
    except Exception as exc:  # pickle, zip or torch errors: all mean "not a state_dict file"
        raise ModelError(
            f"config key 'model': cannot read a state_dict from {config.model!r} ({exc})"
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]  # the common checkpoint layout
    if not isinstance(state, dict):
        raise ModelError(
            f"config key 'model': {config.model!r} holds {type(state).__name__}, not a state_dict"
        )
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise ModelError(
            f"state_dict {config.model!r} does not fit {config.factory!r}: {exc}"
        ) from None
    return module


def _load_onnx(config: Config, metadata: Metadata, device: torch.device) -> LoadedModel:
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError as exc:
        raise ModelError(
            f"ONNX models need the 'onnx' extra: pip install 'torchfleet-runtime[onnx]' ({exc})"
        ) from None
    if config.precision != "fp32":
        raise ConfigError(
            "config key 'precision': ONNX models run at the precision they were exported with; use fp32"
        )
    providers: list[str | tuple[str, dict[str, int]]] = ["CPUExecutionProvider"]
    if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": device.index or 0}))
    session = ort.InferenceSession(str(config.model), providers=providers)
    input_name = session.get_inputs()[0].name

    def run(batch: torch.Tensor) -> Outputs:
        outs: Sequence[Any] = session.run(None, {input_name: np.ascontiguousarray(batch.numpy())})
        tensors = [torch.from_numpy(np.asarray(o)) for o in outs]
        return tensors[0] if len(tensors) == 1 else tuple(tensors)

    return LoadedModel(metadata, Predictor(run, device, None, uses_torch=False), "onnx", device)
