"""The demo model family: the same seed gives the same weights; `width`/`stem` build the peer
benchmark's larger model from the same code."""

from __future__ import annotations

import pytest
import torch
from torchfleet_runtime import demo

# Fingerprints of the weights as the code before `width`/`stem` existed built them (the demo's
# build_demo_model and benchmarks/peers' own copy of the wide network): any change to the seed,
# the layer order or the initialisation moves them.
DEMO_WEIGHTS = "a43fbb1da2c288b7"
WIDE_WEIGHTS = "57fbf94197c6e9b8"


def fingerprint(model: torch.nn.Module) -> str:
    return demo.weights_fingerprint(model)[:16]


def test_the_demo_model_keeps_its_weights():
    model = demo.build_demo_model()
    assert fingerprint(model) == DEMO_WEIGHTS
    assert sum(p.numel() for p in model.parameters()) == demo.metadata()["parameters"]
    assert model(torch.zeros(2, *demo.INPUT_SHAPE)).shape == (2, demo.NUM_CLASSES)


def test_two_saves_of_the_demo_model_report_one_version(tmp_path):
    """Each save's bytes differ (torch's serialization id), the declared version does not: a
    fleet whose nodes each generated the demo model serves one version."""
    from torchfleet_compat.model_version import model_version, sidecar_version

    one, _ = demo.write_demo_model(tmp_path / "one")
    two, _ = demo.write_demo_model(tmp_path / "two")
    versions = {model_version(sidecar_version(p), p) for p in (one, two)}
    assert versions == {"demo-" + demo.weights_fingerprint(demo.build_demo_model())[:12]}
    assert versions == {"demo-" + DEMO_WEIGHTS[:12]}


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
