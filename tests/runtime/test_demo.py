"""The demo model family: the same seed gives the same weights; `width`/`stem` build the peer
benchmark's larger model from the same code."""

from __future__ import annotations

import hashlib

import pytest
import torch
from torchfleet_runtime import demo

# Fingerprints of the weights as the code before `width`/`stem` existed built them (the demo's
# build_demo_model and benchmarks/peers' own copy of the wide network): any change to the seed,
# the layer order or the initialisation moves them.
DEMO_WEIGHTS = "a43fbb1da2c288b7"
WIDE_WEIGHTS = "57fbf94197c6e9b8"


def fingerprint(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def test_the_demo_model_keeps_its_weights():
    model = demo.build_demo_model()
    assert fingerprint(model) == DEMO_WEIGHTS
    assert sum(p.numel() for p in model.parameters()) == demo.metadata()["parameters"]
    assert model(torch.zeros(2, *demo.INPUT_SHAPE)).shape == (2, demo.NUM_CLASSES)


def test_the_peer_benchmarks_wide_model_is_the_demo_family_with_a_wider_resnet_stem():
    from torchfleet_bench.peers import models

    wide = demo.build_demo_model(width=models.WIDE_FACTOR, stem="resnet")
    assert fingerprint(wide) == WIDE_WEIGHTS
    assert sum(p.numel() for p in wide.parameters()) == 11_034_346
    with torch.inference_mode():
        out = torch.jit.script(wide)(torch.zeros(1, *models.WIDE_INPUT))
    assert out.shape == (1, demo.NUM_CLASSES)


def test_building_does_not_touch_the_callers_random_state():
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    demo.build_demo_model(width=2, stem="resnet")
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize(
    "kw, message", [({"width": 0}, "width"), ({"stem": "vit"}, "stem must be one of demo, resnet")]
)
def test_bad_family_parameters_are_named(kw, message):
    with pytest.raises(ValueError, match=message):
        demo.build_demo_model(**kw)
