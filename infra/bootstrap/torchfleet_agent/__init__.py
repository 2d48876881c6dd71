"""torchfleet node agent: a node the cloud starts configures itself with the same playbooks.

Shipped in the node bundle (agent/torchfleet_agent/, infra.bundle) and run from the bootstrap
venv by the user-data stub (boot.py: venv, bundle fetched with the instance's credentials and
verified, then this package), configured by /etc/torchfleet/node.json (a BootstrapSpec).
Commands (`torchfleet-node COMMAND`), each run by a systemd unit or a role:

  bootstrap        torchfleet-bootstrap.service, on EVERY boot until the state is ready
                   (bootstrap.py): configure with the bundle's playbooks, join the group when
                   /readyz answers 200; any failure is named and abandons the launch
  lifecycle-watch  torchfleet-lifecycle.service: drain a terminating node, then let the group
                   take it; complete a warm-pool node's launch action when it is put in service
  publish-metrics  torchfleet-metrics.timer (15 s): queue depth, GPU utilisation, request rate
  fetch SRC DEST   s3:// or oss:// download (the model, for the inference_runtime role)
  prepare-image    bake: forget what makes this node unique, power off
  status           print the state file

State file /var/lib/torchfleet/bootstrap.json (state.py): "state" running | warmed (configured
in a warm pool) | ready | failed | terminating. Python >= 3.8; the cloud's SDKs come from the
bootstrap venv (boto3 on AWS; Alibaba's official SDKs on Alibaba Cloud), Ansible from its own
venv (playbook.py).
"""
