"""A secret's contents as root-only files, replaced atomically and only when they changed: the
one write of the node agent's `api-token`, `node-tls` and `journal-tls` commands (cli.py), and
the monitoring host's journal certificate reader when this file runs as a program
(roles/monitoring ships it as files/torchfleet_journal_tls.py):

    torchfleet_journal_tls.py --cloud aws|alicloud [--region R] [--endpoint URL] SECRET CERT KEY CA

The secret is a JSON document {"certificate", "private_key", "ca"} (PEM), read with the host's
own credentials: AWS Secrets Manager through boto3 (the instance profile), Alibaba KMS
GetSecretValue through the OpenAPI client (the instance RAM role that ALIBABA_CLOUD_ECS_METADATA
names, through the SDK's default credential chain). The three fields go to CERT, KEY and CA
(0640 root). A line containing " written to " says that a file was replaced (the monitoring
role then restarts the journal receiver); an unchanged secret prints nothing. A read that fails
exits 1 with the reason and leaves the files as they were. The key is never printed.

Standard library at import, the cloud's SDK imported when called, no relative import: the
monitoring host has the spend exporter's SDKs and no torchfleet package.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from typing import Any, Sequence

# the secret's JSON fields, in the order of the files they go to (CERT KEY CA)
TLS_FIELDS = ("certificate", "private_key", "ca")
KMS_VERSION = "2016-01-20"  # Alibaba KMS' RPC API


def write_file(dest: str, text: str, gid: int = -1) -> bool:
    """DEST holds `text` (0640, root:gid; gid -1: the writer's group) afterwards; False when it
    already did (not touched). Renamed into place: a reader sees the old file or the new one."""
    data = (text.rstrip("\n") + "\n").encode()
    try:
        with open(dest, "rb") as f:
            st = os.fstat(f.fileno())
            same = (
                f.read() == data
                and st.st_mode & 0o7777 == 0o640
                and (gid == -1 or st.st_gid == gid)
                and (os.geteuid() != 0 or st.st_uid == 0)
            )
    except FileNotFoundError:
        same = False
    if same:
        return False
    fd = os.open(dest + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chown(dest + ".tmp", 0 if os.geteuid() == 0 else -1, gid)
    os.chmod(dest + ".tmp", 0o640)
    os.replace(dest + ".tmp", dest)
    return True


def write_fields(
    name: str, text: str, targets: Sequence[tuple[str, str]], gid: int = -1
) -> list[str]:
    """Each (DEST, FIELD) of `targets`: the secret `name`'s JSON field FIELD into DEST
    (write_file). Every field is checked before any file is touched. The files replaced."""
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    fields = [field for _dest, field in targets]
    missing = [f for f in fields if not isinstance(doc, dict) or not isinstance(doc.get(f), str)]
    if missing:
        raise ValueError(
            f"secret {name}: {', '.join(missing)} is invalid (absent or not a string); "
            f"allowed: a JSON document with the PEM fields {', '.join(fields)}"
        )
    assert isinstance(doc, dict)
    return [dest for dest, field in targets if write_file(dest, doc[field], gid)]


def read_aws(name: str, region: str, endpoint: str) -> str:
    """The secret's string from Secrets Manager with the default credentials (the instance's)."""
    import boto3

    client = boto3.client(
        "secretsmanager", region_name=region or None, endpoint_url=endpoint or None
    )
    value: str = client.get_secret_value(SecretId=name)["SecretString"]
    return value


def read_alicloud(name: str, region: str, endpoint: str) -> str:
    """The secret's data from KMS (GetSecretValue) with the default credential chain (the
    instance RAM role ALIBABA_CLOUD_ECS_METADATA names)."""
    from alibabacloud_credentials.client import Client as Credentials
    from alibabacloud_tea_openapi.models import Config

    config = Config(credential=Credentials(), region_id=region, connect_timeout=3000)
    config.read_timeout = 10000
    if endpoint:
        url = urllib.parse.urlsplit(endpoint)
        config.endpoint, config.protocol = url.netloc, url.scheme
    else:  # the generic client has no endpoint table of its own
        config.endpoint = f"kms.{region}.aliyuncs.com"
    reply = openapi_rpc(config, "GetSecretValue", KMS_VERSION, {"SecretName": name})
    return str(reply["SecretData"])


def openapi_rpc(config: Any, action: str, version: str, query: dict[str, str]) -> dict[str, Any]:
    """One signed RPC call through Alibaba's OpenAPI client (the call each product SDK wraps):
    the reply's body. The node agent's KMS and SLB calls (alicloud.py) go through it too."""
    from alibabacloud_tea_openapi.client import Client as OpenApiClient
    from alibabacloud_tea_openapi.models import OpenApiRequest, Params
    from darabonba.runtime import RuntimeOptions

    params = Params(
        action=action,
        version=version,
        protocol="HTTPS",
        pathname="/",
        method="POST",
        auth_type="AK",
        style="RPC",
        req_body_type="formData",
        body_type="json",
    )
    reply = OpenApiClient(config).call_api(params, OpenApiRequest(query=query), RuntimeOptions())
    body: dict[str, Any] = reply.get("body") or {}
    return body


READERS = {"aws": read_aws, "alicloud": read_alicloud}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="torchfleet_journal_tls.py",
        description="The journal's certificate, key and CA from the cloud's secret store.",
    )
    p.add_argument("--cloud", required=True, choices=sorted(READERS))
    p.add_argument("--region", default="", help="the secret store's region")
    p.add_argument("--endpoint", default="", help="the secret store's URL (default: the region's)")
    p.add_argument("secret")
    p.add_argument("files", nargs=3, metavar="CERT KEY CA")
    args = p.parse_args(argv)
    if args.cloud == "alicloud" and not args.region:
        p.error("--region= is invalid; allowed: the KMS region of the secret (alicloud)")
    try:
        text = READERS[args.cloud](args.secret, args.region, args.endpoint)
        written = write_fields(args.secret, text, list(zip(args.files, TLS_FIELDS)))
    except Exception as err:  # the SDK's errors, the network's, a malformed secret
        print(
            f"torchfleet_journal_tls: reading secret {args.secret} failed, the files stay as "
            f"they were: {type(err).__name__}: {err}",
            file=sys.stderr,
        )
        return 1
    if written:
        print(f"the journal's certificate of secret {args.secret} written to {', '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
