"""torchfleet infra: Pulumi stacks for GPU inference fleets on AWS and Alibaba Cloud.

Run by Pulumi as a directory program (Pulumi.yaml `main: infra/`, see __main__.py), imported as
the package `infra` by the offline plan (`python -m infra.plan STACK`) and the tests."""
