#!/usr/bin/python
"""torchfleet_install: a role's directories, files and systemd units in one module call.

Each `file`, `copy`, `template` and `systemd_service` task is one round trip to the node (about
0.3-0.8 s with SSH pipelining), most of it Ansible's own overhead, and an idempotent re-run of
site.yml was mostly those round trips. A role hands this module everything it installs (files
rendered on the controller with the `template` / `file` lookups) and the units to enable, start
or restart; the module changes only what differs and says what it changed.

The canonical file is playbooks/library/torchfleet_install.py; each role that uses it links it
from its own library/ (a role stays usable from any playbook), and the node bundle stores the
links as content. Python 3.8+ on the node, stdlib only."""

from __future__ import annotations

import grp
import os
import pwd
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: torchfleet_install
short_description: Install directories, files and systemd units in one call
description:
  - Creates directories, writes files (atomically, only when their bytes differ) with their
    owner, group and mode, runs C(systemctl daemon-reload) when a unit file changed, and brings
    units to the enabled state and run state asked for. A unit is restarted when a file naming
    it in I(restarts) changed, or its own unit file changed, and it is meant to run.
  - Supports check mode and diff mode.
options:
  directories:
    description: Directories to create (parents are created root 0755 when missing).
    type: list
    elements: dict
    default: []
    suboptions:
      path: {type: path, required: true}
      owner: {type: str, default: root}
      group: {type: str, default: root}
      mode: {type: raw, required: true, description: a quoted octal string such as '0755'}
  files:
    description: Files to write; their directory must exist (or be in I(directories)).
    type: list
    elements: dict
    default: []
    suboptions:
      dest: {type: path, required: true}
      content: {type: str, required: true}
      owner: {type: str, default: root}
      group: {type: str, default: root}
      mode: {type: raw, required: true, description: a quoted octal string such as '0644'}
      restarts:
        description: Units to restart when this file changed (when they run or are to run).
        type: list
        elements: str
        default: []
  units:
    description: systemd units to bring to a state, after the files are written.
    type: list
    elements: dict
    default: []
    suboptions:
      name: {type: str, required: true}
      enabled: {type: bool}
      state: {type: str, choices: [started, stopped]}
"""

RETURN = r"""
files: {description: the files written or whose owner/group/mode changed, type: list}
directories: {description: the directories created or changed, type: list}
units: {description: what was done to units, e.g. "x.timer enabled", type: list}
daemon_reload: {description: whether systemd re-read its unit files, type: bool}
"""

UNIT_DIRS = ("/etc/systemd/system/", "/lib/systemd/system/", "/usr/lib/systemd/system/")
# Diffs of larger files are left out of the output (a script, not a wheel, is what changes).
DIFF_MAX_BYTES = 256 * 1024


class Installer:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.check = module.check_mode
        self.files: list[str] = []
        self.directories: list[str] = []
        self.units: list[str] = []
        self.diffs: list[dict] = []
        self.daemon_reload = False
        self.restart: set[str] = set()
        self.unit_files: set[str] = set()

    # --- ownership and mode -----------------------------------------------------------------
    def _ids(self, owner: str, group: str) -> tuple[int, int]:
        try:
            uid = pwd.getpwnam(owner).pw_uid
        except KeyError:
            self.module.fail_json(msg=f"torchfleet_install: no user {owner!r} on the node")
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            self.module.fail_json(msg=f"torchfleet_install: no group {group!r} on the node")
        return uid, gid

    def _mode(self, spec: dict, what: str) -> int:
        # A string only: YAML reads an unquoted 0644 as the number 420, which would pass as "420".
        mode = spec["mode"]
        if not isinstance(mode, str) or not mode.isdigit() or set(mode) - set("01234567"):
            self.module.fail_json(
                msg=f"torchfleet_install: {what}: mode {mode!r} must be a quoted octal string "
                "such as '0644'"
            )
        return int(mode, 8)

    def _attributes(self, path: str, uid: int, gid: int, mode: int) -> bool:
        st = os.lstat(path)
        differs = st.st_uid != uid or st.st_gid != gid or (st.st_mode & 0o7777) != mode
        if differs and not self.check:
            os.chown(path, uid, gid)
            os.chmod(path, mode)
        return differs

    # --- directories and files --------------------------------------------------------------
    def directory(self, spec: dict) -> None:
        path = spec["path"]
        uid, gid = self._ids(spec["owner"], spec["group"])
        mode = self._mode(spec, path)
        if os.path.lexists(path) and not os.path.isdir(path):
            self.module.fail_json(msg=f"torchfleet_install: {path} exists and is not a directory")
        if not os.path.isdir(path):
            self.directories.append(path)
            self.diffs.append({"before_header": path, "after_header": path,
                               "before": "absent\n", "after": "directory\n"})  # fmt: skip
            if not self.check:
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                os.mkdir(path, mode)
                os.chown(path, uid, gid)
                os.chmod(path, mode)
            return
        if self._attributes(path, uid, gid, mode):
            self.directories.append(path)

    def file(self, spec: dict, created_dirs: set[str]) -> None:
        dest = spec["dest"]
        data = spec["content"].encode("utf-8")
        uid, gid = self._ids(spec["owner"], spec["group"])
        mode = self._mode(spec, dest)
        parent = os.path.dirname(dest)
        if not os.path.isdir(parent) and not (self.check and parent in created_dirs):
            self.module.fail_json(
                msg=f"torchfleet_install: the directory of {dest} does not exist (list it in "
                "`directories`)"
            )
        if os.path.lexists(dest) and not os.path.isfile(dest):
            self.module.fail_json(msg=f"torchfleet_install: {dest} exists and is not a file")
        before = None
        if os.path.isfile(dest):
            with open(dest, "rb") as fh:
                before = fh.read()
        if before == data:
            if self._attributes(dest, uid, gid, mode):
                self._changed_file(spec)
            return
        self._changed_file(spec)
        if (
            self.module._diff
            and len(data) <= DIFF_MAX_BYTES
            and len(before or b"") <= DIFF_MAX_BYTES
        ):
            self.diffs.append({
                "before_header": dest, "after_header": dest,
                "before": (before or b"").decode("utf-8", "replace"), "after": spec["content"],
            })  # fmt: skip
        if self.check:
            return
        fd, tmp = tempfile.mkstemp(prefix=".torchfleet-", dir=parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chown(tmp, uid, gid)
            os.chmod(tmp, mode)
            os.replace(tmp, dest)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def _changed_file(self, spec: dict) -> None:
        dest = spec["dest"]
        self.files.append(dest)
        self.restart.update(spec["restarts"])
        if dest.startswith(UNIT_DIRS):
            self.daemon_reload = True
            self.unit_files.add(os.path.basename(dest))

    # --- systemd ----------------------------------------------------------------------------
    def _systemctl(self, *args: str, check: bool = True) -> tuple[int, str]:
        rc, out, err = self.module.run_command(["systemctl", *args])
        if check and rc != 0:
            self.module.fail_json(
                msg=f"torchfleet_install: systemctl {' '.join(args)} failed (rc {rc}): "
                f"{(err or out).strip()}",
                files=self.files,
                units=self.units,
            )
        return rc, out.strip()

    def _act(self, name: str, verb: str, done: str) -> None:
        self.units.append(f"{name} {done}")
        if not self.check:
            self._systemctl(verb, name)

    def unit(self, spec: dict) -> None:
        name = spec["name"]
        if spec["enabled"] is not None:
            rc, _ = self._systemctl("is-enabled", name, check=False)
            if spec["enabled"] and rc != 0:
                self._act(name, "enable", "enabled")
            elif not spec["enabled"] and rc == 0:
                self._act(name, "disable", "disabled")
        restart = name in self.restart or name in self.unit_files
        self.restart.discard(name)
        rc, _ = self._systemctl("is-active", name, check=False)
        active = rc == 0
        if spec["state"] == "started":
            if not active:
                self._act(name, "start", "started")
            elif restart:
                self._act(name, "restart", "restarted")
        elif spec["state"] == "stopped":
            if active:
                self._act(name, "stop", "stopped")
        elif restart and active:
            self._act(name, "restart", "restarted")

    def run(self) -> None:
        params = self.module.params
        for spec in params["directories"]:
            self.directory(spec)
        created = {spec["path"] for spec in params["directories"]}
        for spec in params["files"]:
            self.file(spec, created)
        if self.daemon_reload and not self.check:
            self._systemctl("daemon-reload")
        for spec in params["units"]:
            self.unit(spec)
        # Units a changed file names in `restarts` but not managed here: restarted only if they
        # run. (A changed unit file restarts only a unit listed in `units`.)
        for name in sorted(self.restart):
            rc, _ = self._systemctl("is-active", name, check=False)
            if rc == 0:
                self._act(name, "restart", "restarted")
        changed = bool(self.files or self.directories or self.units)
        result = {
            "changed": changed,
            "files": self.files,
            "directories": self.directories,
            "units": self.units,
            "daemon_reload": self.daemon_reload,
        }
        if self.module._diff:
            result["diff"] = self.diffs
        self.module.exit_json(**result)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "directories": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "path": {"type": "path", "required": True},
                    "owner": {"type": "str", "default": "root"},
                    "group": {"type": "str", "default": "root"},
                    "mode": {"type": "raw", "required": True},
                },
            },
            "files": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "dest": {"type": "path", "required": True},
                    "content": {"type": "str", "required": True},
                    "owner": {"type": "str", "default": "root"},
                    "group": {"type": "str", "default": "root"},
                    "mode": {"type": "raw", "required": True},
                    "restarts": {"type": "list", "elements": "str", "default": []},
                },
            },
            "units": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "name": {"type": "str", "required": True},
                    "enabled": {"type": "bool"},
                    "state": {"type": "str", "choices": ["started", "stopped"]},
                },
            },
        },
        supports_check_mode=True,
    )
    Installer(module).run()


if __name__ == "__main__":
    main()
