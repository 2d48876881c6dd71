"""The demo's node path, which is `torchfleet up`'s node stage, for real: a systemd container
node, the stack-shaped inventory of the mock-engine aws-dev run with the container's addresses,
site.yml + verify.yml through ansible-runner, the readiness wait through an SSH tunnel, the
prediction through the stack's endpoint (HAProxy in front of the node: HTTPS verified against
the demo's CA, with the API token), 401 there without or with a wrong token, and predictions on
the published runtime port with the token.

The ONE test that converges a node from scratch (a few minutes): it runs `torchfleet demo`'s
code with its own container prefix (a random suffix, so it never meets a developer's demo) and
removes everything it made, also when it fails."""

from __future__ import annotations

import io
import re
import uuid

import pytest
import yaml

from infra import client
from infra.deploy import containers, demo, pipeline
from infra.deploy.progress import Console


@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_demo_converges_a_container_node_and_predicts_through_the_endpoint():
    missing = containers.missing_tools("podman", "runc", "ssh", "ssh-keygen")
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run `make setup`")
    prefix = f"torchfleet-demo-e2e{uuid.uuid4().hex[:6]}-"
    out = io.StringIO()
    console = Console(out, live=False)
    try:
        result = demo.run(console, prefix, 1, bench=False, plan=False)
        inventories = demo.state_dir(prefix) / "inventories"
        inventory = yaml.safe_load((inventories / "aws-dev" / "stack.yml").read_text())
        # `torchfleet status`'s look at the nodes, on the same converged node
        status = pipeline.status_of(
            "aws-dev", result.summary.outputs, result.summary.cfg, inventories, None
        )
    finally:
        print(out.getvalue())  # the demo's own progress, in the log of a failing run
        console.close()
        demo.clean(Console(io.StringIO(), live=False), prefix)

    (node,) = result.nodes
    summary = "\n".join(result.summary.lines())
    endpoint = result.summary.outputs["endpoint"]
    assert re.fullmatch(r"https://localhost:\d+/", endpoint), endpoint
    assert re.search(
        rf"prediction  POST {re.escape(endpoint)}v1/predict \(direct\) -> 200 in \d+ ms: "
        r"1 output\(s\) of 10 value\(s\)",
        summary,
    ), summary
    # the load balancer: auth on, plain HTTP only redirects, the node a healthy backend
    assert result.balancer_codes == {
        "no token": 401,
        "wrong token": 401,
        "the token": 200,
        "http": 301,
    }
    assert re.search(r"TLSv1\.[23], certificate verified", out.getvalue()), out.getvalue()
    assert f"haproxy backend runtimes/{node.name}: UP" in out.getvalue()
    assert re.search(r"nodes +aws-dev-gpu-0 +127\.0\.0\.1 +ready, batch cap \d+", summary), summary
    assert result.prediction_codes == [200, 200]  # JSON and binary on the published port
    assert "site.yml: changed=" in out.getvalue() and "verify.yml" in out.getvalue()

    # the converge read the stack output's inventory: the program's host, every variable of it
    program = demo.stack_outputs(1)["inventory"]["all"]["children"]["gpu_nodes"]["hosts"]
    host = inventory["all"]["children"]["gpu_nodes"]["hosts"]["aws-dev-gpu-0"]
    assert set(program) == {"aws-dev-gpu-0"} and set(program["aws-dev-gpu-0"]) <= set(host)
    assert (host["ansible_port"], host["private_ip"]) == (node.ssh_port, node.ip)

    (seen,) = status.nodes
    assert seen.ready and seen.model["max_batch_size"] >= 1 and seen.model["device"] == "cpu"

    # and nothing of it is left
    assert containers.list_nodes(prefix) == []
    assert not demo.state_dir(prefix).exists()
    assert client.request("GET", endpoint.replace("https", "http"), timeout=2)[0] is None
