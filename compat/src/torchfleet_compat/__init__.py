"""torchfleet-compat: does a node fit the version matrix (compat/matrix.yml)?

Every module is standard library only and imports its siblings relatively, so the package runs
as itself (infra, `torchfleet-runtime check`) and as Ansible module_utils inside the preflight
role's module on a bare Python 3.8 node.
"""

__version__ = "0.1.0"
