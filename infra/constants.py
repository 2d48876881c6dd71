"""Names and numbers that several parts of infra (and the runtime they deploy) share.

Contract: each is defined here once and imported everywhere it is used; a module that needs
one of them under its own name assigns it from here, never restates the literal.
- `PROJECT`: the Pulumi project (Pulumi.yaml `name`), hence the namespace of every stack
  config key (`torchfleet:...`), the `project` tag, the CloudWatch metric namespace and the
  default Kubernetes namespace.
- `HEALTH_PATH`: the runtime's readiness endpoint (runtime/src/torchfleet_runtime/server.py
  answers 200 only once warmed and not draining): the load balancers' health checks, the
  Kubernetes probes and the controller's readiness wait ask it.
- `SERVICE_PORT`: the runtime's default port (the runtime's `port` default and the
  inference_runtime role's `inference_runtime_port`); the stack key `service_port` overrides it.
- `ROLLOUT_METRICS_OUTPUT`: the stack output of an AWS group stack that says where a rollout
  reads each track's figures in CloudWatch (`ALB_NAMESPACE`, the ALB's and each target group's
  ARN suffix: the metrics' LoadBalancer and TargetGroup dimensions): written by
  infra/aws/edge.py, read by infra/rollout/signals.py's CloudWatchSource.
- `CA_OUTPUT`: the stack output holding the CA (PEM) of a certificate the stack generated
  (`tls: {certificate: generate}`): written by infra/aws/edge.py and infra/alicloud/edge.py,
  trusted by the project's clients (infra/deploy/pipeline.py's `auth_of`).
"""

from __future__ import annotations

PROJECT = "torchfleet"
HEALTH_PATH = "/readyz"
SERVICE_PORT = 8080
ROLLOUT_METRICS_OUTPUT = "rollout_metrics"
CA_OUTPUT = "tls_ca_pem"
ALB_NAMESPACE = "AWS/ApplicationELB"
