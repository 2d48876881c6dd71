"""The inference_runtime role installs the runtime's `gpu` extra (nvidia-ml-py: the NVML gauges
the node agent publishes for GPU scaling) where preflight found a GPU, and nowhere else.

What Ansible itself decides from the role's defaults and vars, run through ansible-playbook on
localhost: the extras, the pip requirement of the runtime wheel and the installed-wheels marker
(which must change when a node gains the extra, or nothing reinstalls). The install itself is
converged for real by the Molecule scenarios (tests/roles/molecule/: `legacy` installs the extra
on a GPU-less node and verifies nvidia-ml-py in the venv; `site` verifies it is absent)."""

from __future__ import annotations

import pytest


def decide(role_play, facts: dict, spec: str, extras: list | None) -> None:
    """Assert, inside Ansible (the assert action runs on the controller), what the role's
    defaults and vars make of `facts`."""
    that = ["__inference_runtime_extras_spec == expected_spec"]
    if extras is not None:
        that.append("inference_runtime_extras == expected_extras")
    role_play(
        "inference_runtime",
        [{"ansible.builtin.assert": {"that": that}}],
        facts,
        {"expected_spec": spec, "expected_extras": extras},
    )


@pytest.mark.parametrize(
    ("facts", "extras", "spec"),
    [
        ({"torchfleet_gpu_present": True}, ["gpu"], "[gpu]"),
        ({"torchfleet_gpu_present": False}, [], ""),
        ({}, [], ""),  # without preflight's fact: no GPU assumed
        (
            {"torchfleet_gpu_present": True, "inference_runtime_extras": ["onnx", "gpu"]},
            None,
            "[gpu,onnx]",
        ),
    ],
)
def test_the_gpu_extra_goes_where_a_gpu_is(role_play, facts, extras, spec):
    decide(role_play, facts, spec, extras)
