"""The journal's transport as the monitoring role renders it on both ends: plain HTTP without
certificates (as before), HTTPS when monitoring_logs_tls_* are given: the receiver listens with
--listen-https and its certificate, the node uploads to https://, verifies the receiver with the
CA and sends its own certificate, and each PEM file reaches its service as a systemd credential
(the upload runs as a dynamic user). The validation refuses a partial set and a missing file,
naming the variables."""

from __future__ import annotations

import configparser
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNITS = {
    "receiver": "systemd-journal-remote.service.conf.j2",
    "upload": "journal-upload.conf.j2",
    "upload_unit": "systemd-journal-upload.service.conf.j2",
}
BASE = {"monitoring_logs_server": "10.42.0.9", "monitoring_stack": "aws-prod"}


def parse_units(texts: dict[str, str]) -> dict[str, configparser.ConfigParser]:
    out = {}
    for kind, text in texts.items():
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read_string(text)
        out[kind] = parser
    return out


def render(render_templates, extra: dict) -> dict[str, configparser.ConfigParser]:
    return parse_units(render_templates("monitoring", UNITS, {**BASE, **extra}))


def exec_start(parser: configparser.ConfigParser) -> list[str]:
    # the drop-in clears ExecStart, then sets it: configparser keeps the last value
    return shlex.split(parser["Service"]["ExecStart"])


def test_plain_http_without_certificates(render_templates):
    units = render(render_templates, {})
    argv = exec_start(units["receiver"])
    assert "--listen-http=-3" in argv and not any(a.startswith("--listen-https") for a in argv)
    assert units["upload"]["Upload"]["URL"] == "http://10.42.0.9:19532"
    assert "ServerKeyFile" not in units["upload"]["Upload"]
    assert "LoadCredential" not in units["upload_unit"]["Service"]
    assert units["upload_unit"]["Service"]["Restart"] == "always"


def test_https_with_client_certificates_on_both_ends(render_templates, tmp_path):
    pems = {
        "monitoring_logs_tls_cert_file": "/etc/torchfleet/journal/cert.pem",
        "monitoring_logs_tls_key_file": "/etc/torchfleet/journal/key.pem",
        "monitoring_logs_tls_ca_file": "/etc/torchfleet/journal/ca.pem",
    }
    texts = render_templates("monitoring", UNITS, {**BASE, **pems})
    # LoadCredential repeats: read the lines themselves
    loads = {
        kind: [
            line.split("=", 1)[1]
            for line in texts[kind].splitlines()
            if line.startswith("LoadCredential=")
        ]
        for kind in ("receiver", "upload_unit")
    }
    # the receiver serves its certificate; the uploader sends its own and verifies with the CA
    assert loads["receiver"] == [
        "key.pem:/etc/torchfleet/journal/key.pem",
        "cert.pem:/etc/torchfleet/journal/cert.pem",
    ], texts["receiver"]
    assert loads["upload_unit"] == loads["receiver"] + ["ca.pem:/etc/torchfleet/journal/ca.pem"]
    units = render(render_templates, pems)
    argv = exec_start(units["receiver"])
    assert argv[0] == "/lib/systemd/systemd-journal-remote"
    assert "--listen-https=-3" in argv and "--listen-http=-3" not in argv
    # %d: the unit's credentials directory. No --trust: Debian 12's receiver is built without
    # GnuTLS and exits on it ("Option --trust is not available"), seen in the Molecule scenario.
    assert {"--key=%d/key.pem", "--cert=%d/cert.pem"} <= set(argv)
    assert not any(a.startswith("--trust") for a in argv)
    assert "--output=/var/log/journal/remote/aws-prod/" in argv
    upload = units["upload"]["Upload"]
    assert upload["URL"] == "https://10.42.0.9:19532"
    folder = "/run/credentials/systemd-journal-upload.service"
    assert upload["ServerKeyFile"] == f"{folder}/key.pem"
    assert upload["ServerCertificateFile"] == f"{folder}/cert.pem"
    assert upload["TrustedCertificateFile"] == f"{folder}/ca.pem"


def run_checks(tmp_path: Path, tool_env: dict[str, str], extra: dict, end: str = "node"):
    # the node's end needs all three files (tasks/node.yml), the receiver's the first two
    files = ["monitoring_logs_tls_cert_file", "monitoring_logs_tls_key_file"]
    files += ["monitoring_logs_tls_ca_file"] if end == "node" else []
    return run_role_tasks(
        tmp_path, tool_env, "logs-tls.yml", {**extra, "__monitoring_logs_tls_files": files}
    )


def run_role_tasks(tmp_path: Path, tool_env: dict[str, str], tasks_from: str, extra: dict):
    """The monitoring role's task file `tasks_from` on localhost, BASE and `extra` as extra vars."""
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
            "tasks": [
                {
                    "ansible.builtin.include_role": {
                        "name": "monitoring",
                        "tasks_from": tasks_from,
                    }
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    (tmp_path / "extra.json").write_text(json.dumps({**BASE, **extra}))
    return subprocess.run(
        ["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", "@extra.json", "play.yml"],
        cwd=tmp_path,
        env=dict(tool_env, ANSIBLE_ROLES_PATH=str(REPO / "roles")),
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize("given", ["partial", "missing", "present", "none"])
def test_the_https_files_are_checked(tmp_path, tool_env, given):
    cert, key, ca = (tmp_path / n for n in ("cert.pem", "key.pem", "ca.pem"))
    extra = {
        "monitoring_logs_tls_cert_file": str(cert),
        "monitoring_logs_tls_key_file": str(key),
        "monitoring_logs_tls_ca_file": str(ca),
    }
    if given == "partial":
        extra["monitoring_logs_tls_ca_file"] = ""
    elif given == "none":
        extra = {}
    if given in ("present", "partial"):
        for f in (cert, key, ca):
            f.write_text("-----BEGIN CERTIFICATE-----\n")
    elif given == "missing":
        cert.write_text("-----BEGIN CERTIFICATE-----\n")  # key and CA absent
    done = run_checks(tmp_path, tool_env, extra)
    output = done.stdout + done.stderr
    if given in ("present", "none"):
        assert done.returncode == 0, output[-3000:]
        return
    if given == "partial":  # no CA: enough for the receiver, not for a node
        assert run_checks(tmp_path, tool_env, extra, end="receiver").returncode == 0
    assert done.returncode != 0, output[-3000:]
    if given == "partial":
        assert "monitoring_logs_tls_ca_file= is invalid; allowed: all" in output, output[-3000:]
    else:
        # the two absent files, not the present certificate
        assert f"monitoring: {key}, {ca} not found" in output, output[-3000:]


def stack(cloud: str) -> dict:
    """What an aws-prod-like or alicloud-prod-like inventory gives the journal's two ends (the
    infra side's monitoring_logs_tls_* variables; the paths are the agent's constants)."""
    from infra.bootstrap import NODE_PATHS
    from infra.bootstrap.torchfleet_agent import local

    names = {
        "aws": ("torchfleet/aws-prod/journal-receiver", "torchfleet/aws-prod/journal-node"),
        "alicloud": (
            "torchfleet-alicloud-prod-journal-receiver",
            "torchfleet-alicloud-prod-journal-node",
        ),
    }[cloud]
    return {
        "torchfleet_cloud": cloud,
        "torchfleet_env": "prod",
        "torchfleet_discovery": {"region": {"aws": "eu-west-1", "alicloud": "cn-shanghai"}[cloud]},
        "monitoring_logs_tls_secret": names[0],
        "monitoring_logs_tls_command": [NODE_PATHS["command"], "journal-tls", names[1]],
        "monitoring_logs_tls_cert_file": local.JOURNAL_TLS_CERT,
        "monitoring_logs_tls_key_file": local.JOURNAL_TLS_KEY,
        "monitoring_logs_tls_ca_file": local.JOURNAL_TLS_CA,
    }


def fetch_argv(role_play, tmp_path: Path, extra: dict) -> dict:
    """The argv each end's fetch task runs (tasks/node.yml, tasks/logs-server.yml) and the
    receiver's environment, as the role's defaults and vars render them."""
    outputs = {
        "node": "__monitoring_logs_tls_node_argv",
        "receiver": "__monitoring_logs_tls_receiver_argv",
        "env": "__monitoring_logs_tls_reader_env",
    }
    tasks = [
        {
            "ansible.builtin.copy": {
                "content": "{{ " + var + " | to_json }}",
                "dest": str(tmp_path / name),
                "mode": "0644",
            }
        }
        for name, var in outputs.items()
    ]
    role_play("monitoring", tasks, extra)
    return {name: json.loads((tmp_path / name).read_text()) for name in outputs}


@pytest.mark.parametrize("cloud", ["aws", "alicloud"])
def test_each_end_fetches_its_certificate_with_its_own_credentials(role_play, tmp_path, cloud):
    """A node runs the agent (its instance's credentials), the monitoring host the role's reader
    in the cloud SDKs' virtualenv with its own role; both get CERT KEY CA appended."""
    given = stack(cloud)
    paths = [given[f"monitoring_logs_tls_{k}_file"] for k in ("cert", "key", "ca")]
    assert [os.path.dirname(p) for p in paths] == ["/etc/torchfleet-journal"] * 3
    got = fetch_argv(role_play, tmp_path, given)
    assert got["node"] == [
        "/usr/local/sbin/torchfleet-node",
        "journal-tls",
        given["monitoring_logs_tls_command"][2],
        *paths,
    ]
    region = given["torchfleet_discovery"]["region"]
    assert got["receiver"] == [
        "/opt/torchfleet-spend/venv/bin/python",
        "/opt/torchfleet-journal/torchfleet_journal_tls.py",
        "--cloud",
        cloud,
        "--region",
        region,
        given["monitoring_logs_tls_secret"],
        *paths,
    ]
    want_env = (
        {"ALIBABA_CLOUD_ECS_METADATA": "torchfleet-alicloud-prod-monitoring"}
        if cloud == "alicloud"
        else {}
    )
    assert got["env"] == want_env
    # the generic form on the receiver: its own command, no reader
    generic = {**given, "monitoring_logs_tls_secret": "", "monitoring_logs_tls_command": ["/x"]}
    got = fetch_argv(role_play, tmp_path, generic)
    assert got["receiver"] == got["node"] == ["/x", *paths] and got["env"] == {}
    assert fetch_argv(role_play, tmp_path, {})["receiver"] == []  # nothing to fetch


def run_fetch_step(tmp_path: Path, tool_env: dict[str, str], extra: dict):
    fetch = {"__monitoring_logs_tls_fetch": ["/bin/true"]}
    return run_role_tasks(tmp_path, tool_env, "logs-tls-fetch.yml", {**extra, **fetch})


def test_the_fetch_step_creates_a_missing_directory_root_only_and_wants_three_paths(
    tmp_path, tool_env
):
    made, kept = tmp_path / "journal-tls", tmp_path / "kept"
    kept.mkdir(mode=0o755)
    kept.chmod(0o755)
    extra = {
        "monitoring_logs_tls_cert_file": str(made / "cert.pem"),
        "monitoring_logs_tls_key_file": str(made / "key.pem"),
        "monitoring_logs_tls_ca_file": str(kept / "ca.pem"),
    }
    done = run_fetch_step(tmp_path, tool_env, extra)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert made.stat().st_mode & 0o7777 == 0o750
    assert kept.stat().st_mode & 0o7777 == 0o755  # a directory the host had is left alone
    done = run_fetch_step(tmp_path, tool_env, {**extra, "monitoring_logs_tls_ca_file": ""})
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "monitoring_logs_tls_ca_file= is invalid with monitoring_logs_tls_command" in output, (
        output[-3000:]
    )


REFRESH_UNITS = {
    "service": "torchfleet-journal-tls.service.j2",
    "timer": "torchfleet-journal-tls.timer.j2",
}


@pytest.mark.parametrize("cloud", ["aws", "alicloud"])
def test_the_receiver_re_reads_its_certificate_daily_with_the_same_command(
    render_templates, role_play, tmp_path, cloud
):
    """A `pulumi up` renews the receiver's certificate in its last 30 days: a daily timer runs
    the receiver's own fetch (the same argv and credentials as the role's task) through the
    refresh script, which restarts journal-remote only when a file changed."""
    given = {**BASE, **stack(cloud), "monitoring_stack": f"{cloud}-prod"}
    argv = fetch_argv(role_play, tmp_path, given)
    texts = render_templates("monitoring", REFRESH_UNITS, given)
    units = parse_units(texts)
    service = units["service"]["Service"]
    assert service["Type"] == "oneshot"
    assert shlex.split(service["ExecStart"]) == [
        "/usr/local/sbin/torchfleet-journal-tls-refresh",
        "systemd-journal-remote.service",
        *argv["receiver"],
    ]
    env = [line for line in texts["service"].splitlines() if line.startswith("Environment=")]
    assert env == [f"Environment={k}={v}" for k, v in argv["env"].items()]
    timer = units["timer"]["Timer"]
    assert timer["OnCalendar"] == "daily" and timer["Persistent"] == "true"


def _refresh(tmp_path: Path, command: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run files/torchfleet-journal-tls-refresh with `command` as the fetch and a stand-in
    systemctl on PATH that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "systemctl.calls"
    calls.unlink(missing_ok=True)
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "systemctl").chmod(0o755)
    (bin_dir / "fetch").write_text(f"#!/bin/sh\n{command}\n")
    (bin_dir / "fetch").chmod(0o755)
    done = subprocess.run(
        [
            str(REPO / "roles/monitoring/files/torchfleet-journal-tls-refresh"),
            "systemd-journal-remote.service",
            str(bin_dir / "fetch"),
            "/etc/x/cert.pem",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        timeout=30,
    )
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_the_refresh_restarts_the_receiver_only_when_the_fetch_replaced_a_file(tmp_path):
    done, calls = _refresh(tmp_path, "exit 0")  # unchanged: the fetch prints nothing
    assert done.returncode == 0 and done.stdout == "" and calls == []
    done, calls = _refresh(tmp_path, 'echo "the journal certificate of S written to $1"')
    assert done.returncode == 0, done.stderr
    assert "written to /etc/x/cert.pem" in done.stdout  # the fetch's own line, for the journal
    assert calls == ["stop systemd-journal-remote.service"]  # its socket starts it again
    done, calls = _refresh(tmp_path, 'echo "refused" >&2; exit 3')  # a failed read
    assert done.returncode == 3 and "refused" in done.stderr and calls == []
