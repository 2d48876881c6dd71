"""The ONNX path (extra `onnx`): a graph equal to rt_models.Tiny, built with onnx.helper, served
through onnxruntime with dynamic batching. Skipped when onnxruntime or onnx is not installed."""

from __future__ import annotations

import pytest
import rt_models
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _tiny_onnx(path) -> None:
    fc = rt_models.tiny().fc
    w = numpy_helper.from_array(fc.weight.detach().numpy().T.copy(), "W")
    b = numpy_helper.from_array(fc.bias.detach().numpy(), "B")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "B"], ["y"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", rt_models.IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", rt_models.OUT])],
        initializer=[w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # readable by older onnxruntime releases too
    onnx.save(model, str(path))


def test_an_onnx_model_serves_the_same_answers(tmp_path, start_runtime, client_for):
    path = tmp_path / "tiny.onnx"
    _tiny_onnx(path)
    rt = start_runtime(model=str(path), max_batch_size=4)
    assert rt.runtime.loaded.format == "onnx" and rt.runtime.batcher.buckets == [1, 2, 4]
    x = torch.randn(6, rt_models.IN)
    status, _, doc = client_for(rt).predict(x.tolist())
    assert status == 200
    assert torch.allclose(torch.tensor(doc["outputs"]), rt_models.expected(x), atol=1e-5)


def test_onnx_refuses_autocast_precisions(tmp_path, start_runtime):
    from torchfleet_runtime.config import Config, ConfigError
    from torchfleet_runtime.model import load

    path = tmp_path / "tiny.onnx"
    _tiny_onnx(path)
    with pytest.raises(
        ConfigError, match="ONNX models run at the precision they were exported with"
    ):
        load(Config(model=str(path), precision="bf16", input_shape=(4,)))
