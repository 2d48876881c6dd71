#!/usr/bin/python
"""Probe a node (read-only) and judge it against the version matrix: the preflight role's module.

Everything it does is torchfleet_compat's (compat/src/torchfleet_compat: preflight.py runs the
package's one probe and the judge `torchfleet-runtime check` uses too). Ansible ships that
package with this file as module_utils: ansible.cfg's `module_utils` (and ANSIBLE_MODULE_UTILS
wherever Ansible runs without it) points at compat/src. It changes nothing and needs only the
standard library, so it runs on Python 3.8+ before anything is installed.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.torchfleet_compat.preflight import ARGUMENTS, PreflightError, run

DOCUMENTATION = r"""
module: torchfleet_probe
short_description: Probe a node and judge it against the torchfleet version matrix.
description:
  - Read-only. Returns the torchfleet_* facts, the problems (each naming the role variable that
    fixes it), a summary and what to install before probing again. See the role's README.
options:
  matrix: {type: dict, required: true, description: The parsed compat/matrix.yml.}
  matrix_file: {type: str, default: compat/matrix.yml, description: Its path, for messages.}
  profile: {type: raw, default: "", description: torchfleet_cuda_profile (empty - the default profile).}
  gpu_model: {type: raw, default: "", description: The GPU model the inventory declares.}
  compute_capability: {type: raw, default: "", description: Declared capability of an unlisted GPU.}
  install_root: {type: str, default: /opt, description: Where free disk is measured.}
  min_free_disk_gb: {type: float, description: Override of the matrix's min_free_disk_gb (0 disables).}
  reused_paths: {type: list, elements: str, default: [], description: An earlier install's trees (count as room).}
  nvidia_driver_force: {type: bool, default: false, description: The driver is installed without a GPU (disk floor).}
  cuda_force: {type: bool, default: false, description: The toolkit is installed without a GPU (disk floor).}
  check_python: {type: bool, default: true, description: Refuse a Python the profile lacks.}
  check_gpu: {type: bool, default: true, description: Refuse a GPU the profile cannot drive.}
  check_distro: {type: bool, default: true, description: Refuse a distro the matrix lacks.}
  check_kernel_headers: {type: bool, default: true, description: Refuse a GPU node without kernel headers.}
  check_gpu_model_match: {type: bool, default: true, description: Refuse a GPU other than the declared one.}
  install_pciutils: {type: bool, default: true, description: Ask for pciutils when lspci is missing on a GPU node.}
  kernel_upgrade_hint: {type: str, default: "", description: What to tell the user when no headers exist.}
  python_interpreter: {type: str, default: "", description: The interpreter's path, for messages.}
  roots:
    type: dict
    default: {}
    description: Test roots (sysfs, dev, proc, modules, apt, apt_lists, os_release, meminfo, kernel).
"""


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENTS, supports_check_mode=True)
    try:
        result = run(module.params)
    except PreflightError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
