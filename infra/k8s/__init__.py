"""`mode: kubernetes`: the runtime on a managed cluster (EKS or ACK) instead of VMs.

What lives here is cloud-neutral: the `kubernetes` block of the stack config (settings.py),
the Kubernetes objects the runtime needs as plain manifests (workload.py), the values of the
Helm releases around it (addons.py), the component that registers both through
pulumi_kubernetes (component.py) and the cluster's fixed cost (cost.py). The clusters and their
node pools are cloud-specific: infra/aws/cluster.py and infra/alicloud/cluster.py.

This package imports no cloud SDK and no pulumi_kubernetes at import time: config.py imports
settings.py on every stack.
"""
