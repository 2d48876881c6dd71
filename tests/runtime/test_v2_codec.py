"""The Open Inference Protocol codec (v2.py) alone, without a server: every datatype in binary and
JSON, BF16 and FP16 as the protocol carries them, output names, and the refusals."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import orjson
import pytest
import torch
from torchfleet_runtime import codec, v2, wire
from torchfleet_runtime.errors import ApiError
from torchfleet_runtime.wire import OutputPart

SHAPE = (2, 3)


def _binary(dtype: str, raw: bytes, shape=(1, *SHAPE), **extra) -> tuple[bytes, dict[str, str]]:
    inp = {
        "name": "input",
        "datatype": v2.DATATYPES[dtype],
        "shape": list(shape),
        "parameters": {"binary_data_size": len(raw)},
    }
    head = orjson.dumps({"inputs": [inp], **extra})
    return head + raw, {v2.HEADER_LENGTH: str(len(head))}


@pytest.mark.parametrize("dtype", list(v2.DATATYPES))
def test_every_datatype_in_binary_is_the_tensor_sent(dtype):
    want = (torch.arange(12).reshape(2, *SHAPE) % 5).to(codec.DTYPES[dtype])
    raw = codec._tensor_bytes(want)
    body, headers = _binary(dtype, raw, shape=(2, *SHAPE))
    d = v2.V2Infer("m", None).decode(body, "application/octet-stream", headers, SHAPE, dtype)
    assert d.binary and d.batched and d.shape == (2, *SHAPE) and d.dtype == dtype
    assert torch.equal(codec.to_tensor(d, codec.DTYPES[dtype]), want)


@pytest.mark.parametrize("dtype", list(v2.DATATYPES))
def test_every_datatype_in_json_nested_or_flat(dtype):
    values = (
        [[[True, False, True], [False, True, True]]]
        if dtype == "bool"
        else [[[1, 2, 3], [4, 5, 6]]]
    )
    for data in (values, [v for row in values[0] for v in row]):  # nested, then flat
        doc = {
            "inputs": [
                {"name": "input", "datatype": v2.DATATYPES[dtype], "shape": [1, 2, 3], "data": data}
            ]
        }
        d = v2.V2Infer("m", None).decode(orjson.dumps(doc), "application/json", {}, SHAPE, dtype)
        t = codec.to_tensor(d, codec.DTYPES[dtype])
        assert not d.binary and t.dtype == codec.DTYPES[dtype]
        assert t.tolist() == torch.tensor(values, dtype=codec.DTYPES[dtype]).tolist()


def test_bf16_is_the_top_half_of_a_float32_in_binary_and_a_number_in_json():
    x = torch.tensor([1.0, -2.5, 3.140625, 1e-3], dtype=torch.bfloat16)
    words = x.view(torch.int16).numpy().astype("<u2").tobytes()
    f32 = np.array(x.float().numpy(), "<f4").view("<u4") >> 16
    assert words == f32.astype("<u2").tobytes()  # what "as the protocol carries it" means
    part = OutputPart(memoryview(words), "bfloat16", (1, 4))
    assert wire.flat_values(part.data, "bfloat16") == x.float().tolist()  # exact decimals
    h16 = np.array([0.5, -1.25, 65504.0], "<f2")
    assert wire.flat_values(h16.tobytes(), "float16") == [0.5, -1.25, 65504.0]
    # a JSON BF16 input is rounded by the owner's cast, to the nearest bfloat16
    doc = {
        "inputs": [
            {
                "name": "input",
                "datatype": "BF16",
                "shape": [1, 4],
                "data": [1.0, 3.14159, -2.5, 1e-3],
            }
        ]
    }
    d = v2.V2Infer("m", None).decode(orjson.dumps(doc), "", {}, (4,), "bfloat16")
    assert codec.to_tensor(d, torch.bfloat16).tolist() == [
        torch.tensor([1.0, 3.14159, -2.5, 1e-3]).to(torch.bfloat16).tolist()
    ]


def test_outputs_named_from_the_structure_and_the_card():
    assert v2.output_names(0) == ["output"]
    assert v2.output_names([0, 1]) == ["output_0", "output_1"]
    assert v2.output_names({"logits": 0, "aux": [1, 2]}) == ["logits", "aux.0", "aux.1"]
    card = codec.output_card(
        {"logits": torch.zeros(2, 10), "mask": torch.zeros(2, 4, dtype=torch.bool)}
    )
    assert card == [
        {"name": "logits", "dtype": "float32", "shape": [10]},
        {"name": "mask", "dtype": "bool", "shape": [4]},
    ]
    meta = v2.model_metadata(
        {
            "name": "m",
            "model_version": "7",
            "format": "torchscript",
            "dtype": "float32",
            "input_shape": [3],
            "outputs": card,
        }
    )
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3]}]
    assert meta["outputs"][1] == {"name": "mask", "datatype": "BOOL", "shape": [-1, 4]}


def test_encode_json_binary_and_selected_outputs():
    logits = np.arange(6, dtype="<f4").reshape(2, 3)
    mask = np.array([[1, 0], [0, 1]], dtype="|u1")
    parts = [
        OutputPart(logits.tobytes(), "float32", (2, 3)),
        OutputPart(mask.tobytes(), "bool", (2, 2)),
    ]
    structure = {"logits": 0, "mask": 1}
    req = v2.V2Infer("m", None)
    req.decode(
        orjson.dumps(
            {
                "id": "a",
                "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 1], "data": [1, 2]}],
                "outputs": [
                    {"name": "mask"},
                    {"name": "logits", "parameters": {"binary_data": True}},
                ],
            }
        ),
        "",
        {},
        (1,),
        "float32",
    )
    body, ctype, headers = req.encode(structure, parts, True, False, False, "7")
    n = int(headers["Inference-Header-Content-Length"])
    doc = orjson.loads(body[:n])
    assert ctype == "application/octet-stream" and doc["id"] == "a" and doc["model_version"] == "7"
    assert doc["outputs"][0] == {
        "name": "mask",
        "datatype": "BOOL",
        "shape": [2, 2],
        "data": [True, False, False, True],
    }
    assert doc["outputs"][1]["parameters"] == {"binary_data_size": 24}
    assert body[n:] == logits.tobytes()
    # a bare instance in: the first row out, without the batch dimension
    req.outputs = None
    body, ctype, _ = req.encode(
        structure,
        [OutputPart(logits[:1].tobytes(), "float32", (1, 3)), parts[1]],
        False,
        False,
        False,
        "7",
    )
    assert ctype == "application/json" and orjson.loads(body)["outputs"][0]["shape"] == [3]
    # NaN in a JSON output: the /v1 rule, unless binary carries it
    with pytest.raises(ApiError) as err:
        req.encode(structure, parts, True, True, False, "7")
    assert err.value.status == 500 and err.value.type == "non_finite_output"
    req.binary_output = True
    assert req.encode(structure, parts, True, True, False, "7")[1] == "application/octet-stream"


def _doc(data=(1, 2, 3), datatype="FP32", shape=(1, 3), **extra) -> bytes:
    inp = {"name": "input", "datatype": datatype, "shape": list(shape), "data": data}
    return orjson.dumps({"inputs": [inp], **extra})


OK = _doc()


@pytest.mark.parametrize(
    ("body", "headers", "words"),
    [
        (b'{"inputs": []}', {}, "expected 1 input"),
        (b"{nope", {}, "not valid JSON"),
        (OK, {v2.HEADER_LENGTH: "0"}, "Inference-Header-Content-Length"),
        (OK, {v2.HEADER_LENGTH: "9999"}, "within the body"),
        (OK, {v2.HEADER_LENGTH: "-5"}, "within the body"),
        (OK + b"xyz", {v2.HEADER_LENGTH: str(len(OK))}, "no input has binary_data_size"),
        (_doc([1, 2]), {}, "needs 3"),
        (_doc([[1, 2], [3]]), {}, "ragged"),
        (_doc(shape=(1, -3)), {}, "non-negative"),
        (_doc(datatype="STRING"), {}, "not one of BOOL"),
        (_doc(datatype="INT64"), {}, "does not match the model's float32"),
        (_doc(id=5), {}, "id must be a string"),
        (_doc(parameters={"binary_data_output": "yes"}), {}, "true or false"),
        (
            _doc(outputs=[{"name": "output", "parameters": {"classification": 3}}]),
            {},
            "classification",
        ),
    ],
)
def test_refusals_name_what_is_wrong(body, headers, words):
    with pytest.raises(ApiError) as err:
        v2.V2Infer("m", None).decode(body, "", headers, (3,), "float32")
    assert err.value.status == 400 and words in err.value.message, err.value.message


def test_a_json_header_past_the_cap_is_refused_before_parsing():
    head = b'{"inputs": [' + b" " * v2.JSON_HEADER_MAX + b"]}"
    with pytest.raises(ApiError, match="over the"):
        v2.V2Infer("m", None).decode(
            head + b"\0" * 12, "", {v2.HEADER_LENGTH: str(len(head))}, (3,), "float32"
        )


def test_another_model_or_version_is_a_404():
    v2.check_model("m", None, "m", "7")
    v2.check_model("m", "7", "m", "7")
    for name, version in (("x", None), ("m", "8")):
        with pytest.raises(ApiError) as err:
            v2.check_model(name, version, "m", "7")
        assert err.value.status == 404


def test_the_codec_imports_no_torch():
    code = (
        "import sys, torchfleet_runtime.v2, torchfleet_runtime.wire; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
