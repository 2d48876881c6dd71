"""The journal's certificates on the monitoring host: the argv the monitoring role runs on each
end (tasks/node.yml, tasks/logs-server.yml) as Ansible renders it from the role's defaults and
vars for an aws-prod-like and an alicloud-prod-like inventory, then the receiver's command run
as a process from the file the role installs (files/torchfleet_journal_tls.py =
infra/bootstrap/torchfleet_agent/secret_files.py) against moto's Secrets Manager (AWS) and the
loopback fake that checks every ACS3 signature (tests/bootstrap/fake_alibaba.py, answering KMS
GetSecretValue):
- the three files hold the secret's fields, 0640, replaced atomically;
- " written to " only when a file changed (the role's changed_when and the receiver's restart);
  an unchanged secret prints nothing and leaves the inodes;
- a refused read exits 1 with the reason and keeps the old files;
- the reader's SDKs are in the virtualenv the role runs it with (monitoring_spend_packages).
The node's end (`torchfleet-node journal-tls`) is tested in tests/bootstrap/test_leave.py. Here
the Alibaba reader signs with access keys from the environment: the default chain the RAM role's
credentials come through on the host (ALIBABA_CLOUD_ECS_METADATA, checked as rendered) reads
those first."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from moto.server import ThreadedMotoServer

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "monitoring"
sys.path.insert(0, str(ROOT / "tests" / "bootstrap"))
sys.path.insert(0, str(ROOT / "tests" / "roles"))
import role_render  # noqa: E402
from fake_alibaba import FakeAlibaba  # noqa: E402

from infra.bootstrap import NODE_PATHS  # noqa: E402
from infra.bootstrap.torchfleet_agent import local, secret_files  # noqa: E402

READER = ROLE / "files" / "torchfleet_journal_tls.py"
FILES = {
    "monitoring_logs_tls_cert_file": local.JOURNAL_TLS_CERT,
    "monitoring_logs_tls_key_file": local.JOURNAL_TLS_KEY,
    "monitoring_logs_tls_ca_file": local.JOURNAL_TLS_CA,
}
PATHS = list(FILES.values())
DOC = {"certificate": "CERT-1", "private_key": "KEY-1", "ca": "CA-1"}
STACKS: dict[str, dict[str, Any]] = {  # what the stack's inventory gives each end
    "aws": {
        "torchfleet_cloud": "aws",
        "torchfleet_env": "prod",
        "torchfleet_discovery": {"cloud": "aws", "region": "eu-west-1", "tags": {}},
        "monitoring_logs_tls_secret": "torchfleet/aws-prod/journal-receiver",
        "monitoring_logs_tls_command": [
            NODE_PATHS["command"],
            "journal-tls",
            "torchfleet/aws-prod/journal-node",
        ],
        **FILES,
    },
    "alicloud": {
        "torchfleet_cloud": "alicloud",
        "torchfleet_env": "prod",
        "torchfleet_discovery": {"cloud": "alicloud", "region": "cn-shanghai", "tags": {}},
        "monitoring_logs_tls_secret": "torchfleet-alicloud-prod-journal-receiver",
        "monitoring_logs_tls_command": [
            NODE_PATHS["command"],
            "journal-tls",
            "torchfleet-alicloud-prod-journal-node",
        ],
        **FILES,
    },
}
OPERATOR = {"ALIBABA_CLOUD_ACCESS_KEY_ID": "operator", "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "s3cret"}


def render(tmp_path: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """What each end runs, as the role's defaults and vars give it: the argv and the
    receiver's environment."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), NO_COLOR="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    texts = role_render.render(
        tmp_path,
        [ROLE / "defaults" / "main.yml", ROLE / "vars" / "main.yml"],
        {
            name: "{{ " + var + " | to_json }}"
            for name, var in (
                ("node", "__monitoring_logs_tls_node_argv"),
                ("receiver", "__monitoring_logs_tls_receiver_argv"),
                ("env", "__monitoring_logs_tls_reader_env"),
            )
        },
        extra,
        env,
    )
    return {name: json.loads(text) for name, text in texts.items()}


def run_receiver(
    argv: list[str], tmp_path: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """The receiver's argv as the role installs it, with this venv's Python, the installed
    reader and the three files under tmp_path."""
    assert argv[:2] == ["/opt/torchfleet-spend/venv/bin/python", secret_reader_path()]
    assert argv[-3:] == PATHS
    files = [str(tmp_path / Path(p).name) for p in PATHS]
    return subprocess.run(
        [sys.executable, str(READER), *argv[2:-3], *files],
        env={**os.environ, "HOME": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def secret_reader_path() -> str:
    return yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__monitoring_logs_tls_reader"]


def files_of(tmp_path: Path) -> list[Path]:
    return [tmp_path / Path(p).name for p in PATHS]


def check_written(done: subprocess.CompletedProcess[str], tmp_path: Path, doc: dict) -> None:
    assert done.returncode == 0, done.stderr
    assert " written to " in done.stdout and doc["private_key"] not in done.stdout + done.stderr
    files = files_of(tmp_path)
    assert [f.read_text() for f in files] == [doc[k] + "\n" for k in secret_files.TLS_FIELDS]
    for f in files:
        st = f.stat()
        assert st.st_mode & 0o7777 == 0o640 and (os.geteuid() != 0 or st.st_uid == 0)
    assert not list(tmp_path.glob("*.tmp"))


def test_aws_receiver_reads_its_secret_with_the_hosts_credentials(tmp_path: Path) -> None:
    stack = STACKS["aws"]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        rendered = render(tmp_path, {**stack, "monitoring_logs_tls_endpoint": url})
        argv = rendered["receiver"]
        assert argv[2:-3] == [
            "--cloud",
            "aws",
            "--region",
            "eu-west-1",
            "--endpoint",
            url,
            "torchfleet/aws-prod/journal-receiver",
        ]
        assert rendered["env"] == {}  # the instance profile: boto3's default chain
        keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        sm = boto3.client(
            "secretsmanager", region_name="eu-west-1", endpoint_url=url, **_lower(keys)
        )
        name = stack["monitoring_logs_tls_secret"]
        sm.create_secret(Name=name, SecretString=json.dumps(DOC))

        check_written(run_receiver(argv, tmp_path, keys), tmp_path, DOC)
        inodes = [f.stat().st_ino for f in files_of(tmp_path)]
        again = run_receiver(argv, tmp_path, keys)
        assert (again.returncode, again.stdout) == (0, "")  # unchanged: no restart
        assert [f.stat().st_ino for f in files_of(tmp_path)] == inodes

        rotated = {**DOC, "certificate": "CERT-2", "private_key": "KEY-2"}
        sm.put_secret_value(SecretId=name, SecretString=json.dumps(rotated))
        done = run_receiver(argv, tmp_path, keys)
        check_written(done, tmp_path, rotated)
        cert, key, ca = files_of(tmp_path)
        assert done.stdout.strip().endswith(f" written to {cert}, {key}")  # not the CA
        assert ca.stat().st_ino == inodes[2]

        sm.delete_secret(SecretId=name, ForceDeleteWithoutRecovery=True)
        refused = run_receiver(argv, tmp_path, keys)
        assert refused.returncode == 1 and refused.stdout == ""
        assert (
            f"reading secret {name} failed, the files stay as they were: "
            "ResourceNotFoundException" in refused.stderr
        ), refused.stderr
        check_written(done, tmp_path, rotated)  # the last files stay
    finally:
        server.stop()


def _lower(keys: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in keys.items()}


def kms(store: dict[str, str]):
    def answer(action: str, params: dict[str, str]) -> dict[str, Any]:
        assert action == "GetSecretValue", action
        name = params["SecretName"]
        if name not in store:
            return {"Code": "Forbidden.ResourceNotFound", "Message": f"{name} not found"}
        return {"SecretName": name, "SecretData": store[name], "VersionId": "v1"}

    return answer


def test_alicloud_receiver_reads_kms_with_a_signed_call(tmp_path: Path) -> None:
    stack = STACKS["alicloud"]
    name = stack["monitoring_logs_tls_secret"]
    store = {name: json.dumps(DOC)}
    with FakeAlibaba(kms(store), access_key="operator", secret="s3cret", token=None) as fake:
        rendered = render(tmp_path, {**stack, "monitoring_logs_tls_endpoint": fake.url})
        argv = rendered["receiver"]
        assert argv[2:-3] == [
            "--cloud",
            "alicloud",
            "--region",
            "cn-shanghai",
            "--endpoint",
            fake.url,
            name,
        ]
        # the host's RAM role (infra/alicloud/monitoring.py's, the spend exporter's)
        assert rendered["env"] == {
            "ALIBABA_CLOUD_ECS_METADATA": "torchfleet-alicloud-prod-monitoring"
        }
        env = {**rendered["env"], **OPERATOR}
        check_written(run_receiver(argv, tmp_path, env), tmp_path, DOC)
        assert fake.refused == []
        assert [(c["action"], c["version"], c["params"]["SecretName"]) for c in fake.calls] == [
            ("GetSecretValue", secret_files.KMS_VERSION, name)
        ]
        again = run_receiver(argv, tmp_path, env)
        assert (again.returncode, again.stdout) == (0, "")

        store[name] = json.dumps({**DOC, "ca": "CA-2"})
        done = run_receiver(argv, tmp_path, env)
        check_written(done, tmp_path, {**DOC, "ca": "CA-2"})
        assert done.stdout.strip().endswith(f" written to {files_of(tmp_path)[2]}")

    with FakeAlibaba(kms(store), access_key="operator", secret="other", token=None) as fake:
        argv = render(tmp_path, {**stack, "monitoring_logs_tls_endpoint": fake.url})["receiver"]
        refused = run_receiver(argv, tmp_path, env)
        assert fake.refused  # not the account's secret
    assert refused.returncode == 1 and refused.stdout == ""
    assert "failed, the files stay as they were" in refused.stderr
    assert "SignatureDoesNotMatch" in refused.stderr
    check_written(done, tmp_path, {**DOC, "ca": "CA-2"})


@pytest.mark.parametrize("bad", ["not json", json.dumps({"certificate": "C", "ca": 3})])
def test_a_malformed_secret_touches_no_file(tmp_path: Path, bad: str) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("OLD\n")
    targets = list(
        zip(
            [str(cert), str(tmp_path / "k"), str(tmp_path / "c")],
            secret_files.TLS_FIELDS,
            strict=True,
        )
    )
    with pytest.raises(ValueError, match=r"secret s: .* is invalid .*; allowed: a JSON document"):
        secret_files.write_fields("s", bad, targets)
    assert cert.read_text() == "OLD\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "cert.pem"
    ]


def test_the_readers_sdks_are_in_the_virtualenv_the_role_runs_it_with() -> None:
    """Each cloud's reader imports only distributions of monitoring_spend_packages[cloud] (the
    virtualenv tasks/cloud-venv.yml installs), whose pins are the controller's
    (tests/monitoring/test_spend_exporter.py); the role ships this very file."""
    assert READER.resolve() == Path(secret_files.__file__).resolve()
    packages = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())[
        "monitoring_spend_packages"
    ]
    tree = ast.parse(READER.read_text())
    owners = importlib.metadata.packages_distributions()
    for cloud, reader in secret_files.READERS.items():
        fn = next(
            n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == reader.__name__
        )
        modules = {
            (n.module if isinstance(n, ast.ImportFrom) else n.names[0].name).split(".")[0]
            for n in ast.walk(fn)
            if isinstance(n, ast.Import | ast.ImportFrom)
        }
        assert modules, cloud
        pinned = {p.split("==")[0].lower() for p in packages[cloud]}
        for module in modules:
            assert {d.lower() for d in owners[module]} & pinned, (cloud, module)
    top = {
        n.names[0].name.split(".")[0] if isinstance(n, ast.Import) else str(n.module)
        for n in tree.body
        if isinstance(n, ast.Import | ast.ImportFrom)
    }
    assert top <= set(sys.stdlib_module_names) | {"__future__"}, top  # stdlib at import


def test_an_alibaba_read_without_a_region_is_refused_by_name(tmp_path: Path, capsys) -> None:
    files = [str(tmp_path / n) for n in ("c", "k", "a")]
    with pytest.raises(SystemExit) as stop:
        secret_files.main(["--cloud", "alicloud", "s", *files])
    assert stop.value.code == 2
    assert "--region= is invalid; allowed: the KMS region" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
