"""The Open Inference Protocol (KServe v2 / Triton HTTP/REST) codec, without torch.

Contract. The /v2 routes (server.py) answer health, server and model metadata and
`POST /v2/models/{name}[/versions/{v}]/infer`. An infer request is a `V2Infer`: `decode` turns
its body (a JSON request, or the binary tensor extension: an `Inference-Header-Content-Length`
JSON header followed by raw little-endian tensor bytes, each input's `parameters.
binary_data_size` long) into the same `wire.Decoded` a /v1 body becomes, so the request joins the
same batcher through the same checks (wire.check_shape, check_dtype, check_size, json_values;
the owner's finite-value check); `encode` turns the answer's `wire.OutputPart`s into a v2
response, each output as JSON `data` or as binary (`parameters.binary_data` per output, or
`binary_data_output` for all). Every refusal is an `ApiError` (errors.py); server.py writes it on
/v2 as Triton does: `{"error": "<message>"}` with 400 for a bad request, 404 for another model
or version, 503 while not ready, 500 for the model's own failure.

Tensors. The model has one input, named `INPUT_NAME`; its datatype must be the model's dtype
(the same refusal as a /v1 binary body). JSON `data` may be flat or nested (row-major); its
element count must match `shape`. FP16 and BF16 in JSON are numbers: an input is rounded to the
nearest value of the type by the owner's cast, an output is written as the exact decimal value of
each element (Triton itself carries these types only as binary data, where they are raw 2-byte
little-endian words: BF16 is the top half of an IEEE float32). Outputs are named from the model's
output structure (`output_names`), the names the model card lists.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import orjson

from . import wire
from .errors import ApiError, bad_input
from .wire import Buffer, Decoded, OutputPart, Structure

# protocol datatype <-> the runtime's dtype names (wire.ELEMENT_SIZE)
DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "int8": "INT8",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "bfloat16": "BF16",
    "float32": "FP32",
    "float64": "FP64",
}
DTYPE_OF = {v: k for k, v in DATATYPES.items()}
INPUT_NAME = "input"
HEADER_LENGTH = "inference-header-content-length"
# the JSON header of a binary-extension request: its tensors follow it, so a header past this is
# refused before it is parsed (a JSON-only request is bounded by max_body_mb alone)
JSON_HEADER_MAX = 64 * 1024
EXTENSIONS = ["binary_tensor_data"]
SERVER_NAME = "torchfleet"
MAX_DIMS = 32
# The `route` label of the request metrics (metrics.py): a route template, never a raw path or a
# model's name, so the series stay two however clients name models; a versioned infer
# (/versions/{v}/infer) is the same route.
V1_ROUTE = "/v1/predict"
V2_ROUTE = "/v2/models/:model/infer"
ROUTE_LABELS = (V1_ROUTE, V2_ROUTE)


def route_label(infer: V2Infer | None) -> str:
    """The route a prediction came by: /v1's, or the /v2 infer template."""
    return V1_ROUTE if infer is None else V2_ROUTE


def is_v2_path(target: str) -> bool:
    """A request target (or the start of one) on the /v2 routes, whose errors are Triton's
    `{"error": "<message>"}`: `/v2` itself or below it, with or without a query."""
    path = target.split("?", 1)[0].split("#", 1)[0]
    return path == "/v2" or path.startswith("/v2/")


def not_found(message: str) -> ApiError:
    return ApiError(404, "not_found", message)


def check_model(name: str, version: str | None, loaded: str, loaded_version: str | None) -> None:
    """A request for another model or version than the loaded one is a 404, never an answer
    from the loaded model."""
    if name != loaded:
        raise not_found(
            f"Request for unknown model: '{name[:100]}' is not found (this node serves '{loaded}')"
        )
    if version is not None and version != loaded_version:
        raise not_found(
            f"Request for unknown model: '{name}' version {version[:100]} is not found "
            f"(this node serves version {loaded_version})"
        )


def output_names(structure: Structure) -> list[str]:
    """Each output part's name, by part index: `output` for a lone tensor, `output_<i>` for the
    i-th of a tuple or list, a dict's keys; nested structures join the names with dots."""
    names: dict[int, str] = {}

    def walk(s: Structure, prefix: str) -> None:
        if isinstance(s, int):
            names[s] = prefix or "output"
        elif isinstance(s, Mapping):
            for k, v in s.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            for i, v in enumerate(s):
                walk(v, f"{prefix}.{i}" if prefix else f"output_{i}")

    walk(structure, "")
    return [names[i] for i in range(len(names))]


def model_metadata(card: Mapping[str, Any]) -> dict[str, Any]:
    """GET /v2/models/{name}: the protocol's model metadata from the runtime's model card
    (/v1/model); -1 marks the batch dimension."""
    return {
        "name": card["name"],
        "versions": [card["model_version"]],
        "platform": "pytorch_" + str(card.get("format", "torchscript")),
        "inputs": [
            {
                "name": INPUT_NAME,
                "datatype": DATATYPES[card["dtype"]],
                "shape": [-1, *card["input_shape"]],
            }
        ],
        "outputs": [
            {"name": o["name"], "datatype": DATATYPES[o["dtype"]], "shape": [-1, *o["shape"]]}
            for o in card.get("outputs", [])
        ],
    }


def server_metadata(version: str) -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": version, "extensions": EXTENSIONS}


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or len(value) > MAX_DIMS
        or not all(type(d) is int and 0 <= d < 1 << 40 for d in value)
    ):
        raise bad_input(
            f"{where} shape {str(value)[:80]} is not a list of at most {MAX_DIMS} non-negative "
            "integers",
            "wrong_shape",
        )
    return tuple(value)


def _bool_param(params: Mapping[str, Any], key: str, where: str) -> bool | None:
    value = params.get(key)
    if value is not None and not isinstance(value, bool):
        raise bad_input(f"{where} parameter {key} must be true or false, not {str(value)[:40]}")
    return value


def _params(doc: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise bad_input(f"{where} parameters must be a JSON object")
    return params


class V2Infer:
    """One infer request: the model it names, then (decode) what it asked for."""

    def __init__(self, model: str, version: str | None) -> None:
        self.model = model
        self.version = version
        self.id: str | None = None
        self.binary_output = False
        self.outputs: list[tuple[str, bool | None]] | None = None  # requested: name, binary

    # --- the request ---------------------------------------------------------------------------

    def decode(
        self,
        body: bytes | bytearray,
        content_type: str,
        headers: Mapping[str, str],
        input_shape: tuple[int, ...],
        dtype: str,
    ) -> Decoded:
        mv = memoryview(body)
        given = headers.get(HEADER_LENGTH)
        if given is None:
            head, rest = mv, mv[:0]
        else:
            text = given.strip()
            hlen = int(text) if text.isdigit() and len(text) <= 12 else -1
            if not 0 < hlen <= len(body):
                raise bad_input(
                    f"Inference-Header-Content-Length {given[:40]!r} is not a length within the "
                    f"body's {len(body)} bytes",
                    "malformed_json",
                )
            head, rest = mv[:hlen], mv[hlen:]
            if hlen > JSON_HEADER_MAX:
                raise bad_input(
                    f"Inference-Header-Content-Length {hlen} is over the {JSON_HEADER_MAX} bytes "
                    "a JSON header may take before its binary tensors",
                    "malformed_json",
                )
        if not head:
            raise bad_input("the request body is empty", "empty_input")
        try:
            doc = orjson.loads(head)
        except orjson.JSONDecodeError as exc:
            raise bad_input(f"the request is not valid JSON ({exc})", "malformed_json") from None
        if not isinstance(doc, dict):
            raise bad_input('expected a JSON object {"inputs": [...]}', "malformed_json")
        rid = doc.get("id")
        if rid is not None and not isinstance(rid, str):
            raise bad_input("id must be a string")
        self.id = rid
        self.binary_output = bool(
            _bool_param(_params(doc, "the request"), "binary_data_output", "the request")
        )
        self._outputs(doc.get("outputs"))
        inputs = doc.get("inputs")
        if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
            count = len(inputs) if isinstance(inputs, list) else 0
            raise bad_input(
                f"expected 1 input ('{INPUT_NAME}') in 'inputs', got {count}", "empty_input"
            )
        return self._input(inputs[0], rest, input_shape, dtype)

    def _outputs(self, outputs: Any) -> None:
        if outputs is None:
            return
        if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
            raise bad_input("outputs must be a list of objects with a name")
        wanted: list[tuple[str, bool | None]] = []
        for o in outputs:
            name = o.get("name")
            if not isinstance(name, str):
                raise bad_input("every requested output needs a name")
            params = _params(o, f"output '{name[:100]}'")
            if "classification" in params:
                raise bad_input("the classification extension is not supported")
            wanted.append((name, _bool_param(params, "binary_data", f"output '{name[:100]}'")))
        self.outputs = wanted

    def _input(
        self, inp: Mapping[str, Any], rest: memoryview, input_shape: tuple[int, ...], dtype: str
    ) -> Decoded:
        name = inp.get("name")
        if name != INPUT_NAME:
            raise bad_input(
                f"unexpected inference input {str(name)[:100]!r} for model '{self.model}'; "
                f"its input is '{INPUT_NAME}'"
            )
        datatype = inp.get("datatype")
        if datatype not in DTYPE_OF:
            raise bad_input(
                f"input datatype {str(datatype)[:40]!r} is not one of {', '.join(DTYPE_OF)}",
                "wrong_dtype",
            )
        declared = _shape(inp.get("shape"), f"input '{name}'")
        wanted = DTYPE_OF[datatype]
        wire.check_dtype(wanted, dtype)  # the /v1 refusal: the model's dtype, no silent cast
        size = _params(inp, f"input '{name}'").get("binary_data_size")
        data: Buffer
        if size is not None:
            if type(size) is not int or not 0 <= size <= len(rest):
                raise bad_input(
                    f"input '{name}' binary_data_size {str(size)[:40]} is past the "
                    f"{len(rest)} bytes after the JSON header",
                    "wrong_shape",
                )
            if size != len(rest):
                raise bad_input(
                    f"the body holds {len(rest)} bytes after the JSON header; input '{name}' "
                    f"binary_data_size is {size}",
                    "wrong_shape",
                )
            data = wire.check_size(rest, declared, wanted)
            binary = True
        else:
            if len(rest):
                raise bad_input(
                    f"the body holds {len(rest)} bytes after the JSON header and no input has "
                    "binary_data_size",
                    "wrong_shape",
                )
            data, nested, wanted = wire.json_values(inp.get("data"), dtype, f"input '{name}' data")
            if wire.prod(nested) != wire.prod(declared):
                raise bad_input(
                    f"input '{name}' data has {wire.prod(nested)} elements; shape "
                    f"{list(declared)} needs {wire.prod(declared)}",
                    "wrong_shape",
                )
            binary = False
        full, batched = wire.check_shape(declared, input_shape)
        return Decoded(data, full, wanted, batched, binary)

    # --- the response --------------------------------------------------------------------------

    def encode(
        self,
        structure: Structure,
        parts: Sequence[OutputPart],
        batched: bool,
        non_finite: bool,
        as_null: bool,
        version: str | None,
    ) -> tuple[bytes, str, dict[str, str]]:
        """(body, content type, headers) of the 200: parts in their own dtype (not widened)."""
        names = output_names(structure)
        index = {n: i for i, n in enumerate(names)}
        if self.outputs is None:
            chosen = [(i, self.binary_output) for i in range(len(parts))]
        else:
            chosen = []
            for name, binary in self.outputs:
                if name not in index:
                    raise bad_input(
                        f"unexpected inference output '{name[:100]}' for model '{self.model}'; "
                        f"its outputs are {', '.join(names)}"
                    )
                chosen.append((index[name], self.binary_output if binary is None else binary))
        if non_finite and not as_null and not all(b for _, b in chosen):
            raise wire.NON_FINITE_OUTPUT
        outs: list[dict[str, Any]] = []
        blobs: list[bytes] = []
        for i, binary in chosen:
            part = parts[i]
            data, shape = part.data, part.shape
            if not batched:  # one bare instance in, one out
                row = len(data) // shape[0] if shape[0] else 0
                data, shape = data[:row], shape[1:]
            out: dict[str, Any] = {
                "name": names[i],
                "datatype": DATATYPES[part.dtype],
                "shape": list(shape),
            }
            if binary:
                blob = bytes(data)
                out["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                out["data"] = wire.flat_values(data, part.dtype)
            outs.append(out)
        doc: dict[str, Any] = {"model_name": self.model, "model_version": version}
        if self.id is not None:
            doc["id"] = self.id
        doc["outputs"] = outs
        head = orjson.dumps(doc)
        if not blobs:
            return head, "application/json", {}
        return (
            b"".join([head, *blobs]),
            "application/octet-stream",
            {"Inference-Header-Content-Length": str(len(head))},
        )
