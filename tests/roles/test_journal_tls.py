"""The journal's transport as the monitoring role renders it on both ends: plain HTTP without
certificates (as before), HTTPS when monitoring_logs_tls_* are given: the receiver listens with
--listen-https and its certificate, the node uploads to https://, verifies the receiver with the
CA and sends its own certificate, and each PEM file reaches its service as a systemd credential
(the upload runs as a dynamic user). The validation refuses a partial set and a missing file,
naming the variables."""

from __future__ import annotations

import configparser
import json
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


def render(render_templates, extra: dict) -> dict[str, configparser.ConfigParser]:
    texts = render_templates("monitoring", UNITS, {**BASE, **extra})
    out = {}
    for kind, text in texts.items():
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read_string(text)
        out[kind] = parser
    return out


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
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
            "tasks": [
                {
                    "ansible.builtin.include_role": {
                        "name": "monitoring",
                        "tasks_from": "logs-tls.yml",
                    }
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    # the node's end needs all three files (tasks/node.yml), the receiver's the first two
    files = ["monitoring_logs_tls_cert_file", "monitoring_logs_tls_key_file"]
    files += ["monitoring_logs_tls_ca_file"] if end == "node" else []
    extra = {**BASE, **extra, "__monitoring_logs_tls_files": files}
    (tmp_path / "extra.json").write_text(json.dumps(extra))
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
