#!/usr/bin/env python3
"""torchfleet node agent: a node the cloud starts configures itself with the same playbooks.

Written to /usr/local/lib/torchfleet/agent.py by the user-data (infra/bootstrap/, which drops the
other cloud's section, comments and docstrings to fit the 16 KB limit), configured by
/etc/torchfleet/node.json (a BootstrapSpec). Commands, each run by a systemd unit:

  bootstrap        torchfleet-bootstrap.service, a oneshot run on EVERY boot until the state is
                   ready: identity from the metadata service -> bootstrap venv (pinned
                   ansible-core; boto3 on AWS, where the agent continues in that venv) ->
                   bundle fetched with the instance's credentials, sha256 verified, unpacked ->
                   playbooks/site.yml (cold, bake) or baked.yml (baked) against this node ->
                   /readyz 200 -> launch lifecycle action CONTINUE. Any failure: state failed,
                   the stage and the failing task in the journal and the state file, ABANDON.
                   site.yml is idempotent, so a reboot (a new driver) resumes by running it
                   again from the top with the work already done skipped.
  lifecycle-watch  torchfleet-lifecycle.service: terminating -> drain the runtime (systemctl
                   stop; SIGTERM drains it) -> CONTINUE; a running warm-pool node put in
                   service -> CONTINUE its launch action.
  publish-metrics  torchfleet-metrics.timer (15 s): queue depth and GPU utilisation.
  fetch SRC DEST   s3:// or oss:// download (the model, for the inference_runtime role).
  prepare-image    bake: forget what makes this node unique, power off.
  status           print the state file.

State file /var/lib/torchfleet/bootstrap.json, "state": running | warmed (configured in a warm
pool) | ready | failed. Python >= 3.8, standard library only (boto3 from the venv on AWS).
"""

import base64
import datetime
import hashlib
import hmac
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

CONFIG = "/etc/torchfleet/node.json"
STATE = "/var/lib/torchfleet/bootstrap.json"
WORK = "/var/lib/torchfleet/bootstrap"
VENV = "/opt/torchfleet/bootstrap/venv"
RUNTIME = "torchfleet-runtime.service"
# What the bake removes or records (each path once, so tests can move them all elsewhere).
IMAGE_RECORD = "/etc/torchfleet/image.json"
MODELS = "/var/lib/torchfleet/models"
RUNTIME_CACHE = "/var/cache/torchfleet-runtime"
MACHINE_IDS = ("/etc/machine-id", "/var/lib/dbus/machine-id")
SSH_DIR = "/etc/ssh"
CLOUD_SEED = "/var/lib/cloud/seed"
CLOUD_INSTANCE_ID = "/var/lib/cloud/data/instance-id"
REBOOT_FLAG = "/run/reboot-required"
METRICS_SAMPLE = "/run/torchfleet/metrics-sample.json"
WATCHERS = ["torchfleet-lifecycle.service", "torchfleet-metrics.timer"]
MAX_REBOOTS = 2
# Seconds between launch-hook heartbeats, and between the terminating watcher's looks at the
# lifecycle state (IMDS is local; ESS is an API call). infra/lifecycle.py derives the hooks'
# timeouts from these.
HEARTBEAT_S = 120
WATCH_POLL_S = {"aws": 5, "alicloud": 15}
# The bootstrap venv's pins by the Python that runs Ansible (the node is its own controller):
# ansible-core 2.17 needs >= 3.10, 2.19 >= 3.11; the roles need ansible.builtin.systemd_service
# (>= 2.14), so 3.9 gets 2.15 and 3.8 is no controller (controller() installs python3.9).
# Resolved by pip running on each Python (markers differ: botocore wants urllib3 < 1.27 below
# 3.10, cryptography typing-extensions below 3.11). Before "|" every cloud, after it AWS only.
_COMMON = (
    "jinja2==3.1.6 markupsafe==3.0.4 python-dateutil==2.9.0.post0 six==1.17.0 jmespath==1.1.0 "
)
PINS = {
    (3, 9): _COMMON + "ansible-core==2.15.13 resolvelib==1.0.1 packaging==26.3 pyyaml==6.0.3 "
    "cryptography==50.0.2 cffi==2.0.0 pycparser==2.23 importlib-resources==5.0.7 "
    "typing-extensions==4.16.0|boto3==1.42.97 botocore==1.42.97 s3transfer==0.16.1 urllib3==1.26.20",
    (3, 10): _COMMON + "ansible-core==2.17.14 resolvelib==1.0.1 packaging==26.4 pyyaml==6.0.4 "
    "cryptography==50.0.2 cffi==2.1.1 pycparser==3.11 typing-extensions==4.16.0|boto3==1.44.8 "
    "botocore==1.44.8 s3transfer==0.19.3 urllib3==2.8.0",
    (3, 11): _COMMON + "ansible-core==2.19.14 resolvelib==1.2.1 packaging==26.4 pyyaml==6.0.4 "
    "cryptography==50.0.2 cffi==2.1.1 pycparser==3.12|boto3==1.44.8 botocore==1.44.8 "
    "s3transfer==0.19.3 urllib3==2.8.0",
}
PINS[(3, 12)] = PINS[(3, 13)] = PINS[(3, 11)]


class Failure(Exception):
    def __init__(self, stage, message, task=None):
        super().__init__(message)
        self.stage, self.message, self.task = stage, message, task


def pins(version, cloud):
    """The bootstrap venv's requirements for a controller Python (major, minor)."""
    if tuple(version) not in PINS:
        known = ", ".join(f"{a}.{b}" for a, b in sorted(PINS))
        raise Failure(
            "venv",
            f"Python {version[0]}.{version[1]} cannot run the pinned "
            f"ansible-core (supported: {known})",
        )
    every, aws = PINS[tuple(version)].split("|")
    return (every + (" " + aws if cloud == "aws" else "")).split()


def log(msg):
    print("torchfleet-node: " + msg, flush=True)


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def write_json(path, doc, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
    os.chmod(path + ".tmp", mode)
    os.replace(path + ".tmp", path)


def http(method, url, headers=None, data=None, timeout=10):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, resp.read()


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def run(argv, **kw):
    log("$ " + " ".join(argv))
    return subprocess.run(argv, check=False, **kw)


class State:
    """The state file: what the node is doing, for people and for the next boot."""

    def __init__(self):
        self.doc = read_json(STATE, {}) or {}

    def __getitem__(self, key):
        return self.doc.get(key)

    def update(self, **fields):
        self.doc.update(fields)
        write_json(STATE, self.doc)

    def stage(self, name):
        log("stage " + name)
        # seconds from the first start of this bootstrap (boots included) to this stage
        stages = self.doc.setdefault("stages", {})
        stages[name] = round(time.time() - self.doc.get("started_epoch", time.time()), 1)
        self.update(stage=name)


class Imds:
    """A token-protected instance metadata service (AWS IMDSv2, Alibaba's hardened mode)."""

    def __init__(self, base, token_header, ttl_header):
        self.base, self.token_header, self.ttl_header = base.rstrip("/"), token_header, ttl_header
        self.token, self.expires = None, 0.0

    def get(self, path, default=None):
        if time.time() > self.expires:
            _, body = http("PUT", self.base + "/latest/api/token", {self.ttl_header: "21600"})
            self.token, self.expires = body.decode(), time.time() + 21000
        try:
            return http(
                "GET", f"{self.base}/latest/meta-data/{path}", {self.token_header: self.token}
            )[1].decode()
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return default
            raise


# >>> cloud aws
class Aws:
    """boto3 from the bootstrap venv; credentials from the instance role through IMDSv2."""

    def __init__(self, cfg):
        self.cfg, self.endpoints = cfg, cfg.get("endpoints") or {}
        self.imds = Imds(
            self.endpoints.get("imds", "http://169.254.169.254"),
            "X-aws-ec2-metadata-token",
            "X-aws-ec2-metadata-token-ttl-seconds",
        )
        self._clients = {}

    def identity(self):
        m = self.imds.get
        return {
            "instance_id": m("instance-id"),
            "region": m("placement/region", self.cfg["region"]),
            "instance_type": m("instance-type"),
            "spot": m("instance-life-cycle") == "spot",
            "target": m("autoscaling/target-lifecycle-state"),
        }

    def target_state(self):
        return self.imds.get("autoscaling/target-lifecycle-state")

    def client(self, service):
        if service not in self._clients:
            import boto3

            if "imds" in self.endpoints:
                os.environ["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = self.endpoints["imds"]
            os.environ["AWS_EC2_METADATA_V1_DISABLED"] = "true"
            self._clients[service] = boto3.session.Session(region_name=self.cfg["region"]).client(
                service, endpoint_url=self.endpoints.get(service)
            )
        return self._clients[service]

    def fetch(self, bucket, key, dest):
        self.client("s3").download_file(bucket, key, dest)

    def _hook(self, call, hook, instance_id, **extra):
        getattr(self.client("autoscaling"), call)(
            LifecycleHookName=hook,
            AutoScalingGroupName=self.cfg["group_name"],
            InstanceId=instance_id,
            **extra,
        )

    def lifecycle(self, hook, result, instance_id):
        self._hook("complete_lifecycle_action", hook, instance_id, LifecycleActionResult=result)

    def heartbeat(self, hook, instance_id):
        self._hook("record_lifecycle_action_heartbeat", hook, instance_id)

    def put_metrics(self, values):
        dims = [{"Name": "AutoScalingGroupName", "Value": self.cfg["group_name"]}]
        self.client("cloudwatch").put_metric_data(
            Namespace=self.cfg.get("metrics_namespace", "torchfleet"),
            MetricData=[
                {"MetricName": name, "Dimensions": dims, "Value": float(value), "Unit": unit}
                for name, (value, unit) in sorted(values.items())
                if name != "RequestRate"
            ],
        )  # the ALB counts requests per target itself


# <<< cloud aws


# >>> cloud alicloud
def _quote(value):
    return urllib.parse.quote(str(value), safe="-_.~")


def rpc_signature(secret, method, params):
    """Alibaba Cloud RPC signature v1: HMAC-SHA1 over the sorted, percent-encoded query."""
    query = "&".join(_quote(k) + "=" + _quote(v) for k, v in sorted(params.items()))
    to_sign = method + "&%2F&" + _quote(query)
    return base64.b64encode(
        hmac.new((secret + "&").encode(), to_sign.encode(), hashlib.sha1).digest()
    ).decode()


def rpc_call(endpoint, version, action, creds, region, **params):
    """One signed Alibaba Cloud RPC call (GET, JSON); creds: AccessKeyId, AccessKeySecret and
    optionally SecurityToken (STS)."""
    params.update(
        Action=action,
        Version=version,
        Format="JSON",
        AccessKeyId=creds["AccessKeyId"],
        SignatureMethod="HMAC-SHA1",
        SignatureVersion="1.0",
        SignatureNonce=uuid.uuid4().hex,
        Timestamp=now(),
        RegionId=region,
    )
    if creds.get("SecurityToken"):
        params["SecurityToken"] = creds["SecurityToken"]
    params["Signature"] = rpc_signature(creds["AccessKeySecret"], "GET", params)
    try:
        return json.loads(
            http("GET", endpoint + "/?" + urllib.parse.urlencode(params), timeout=20)[1]
        )
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"{action}: HTTP {err.code} {err.read()[:300]!r}") from None


def oss_v4_authorization(ak, secret, region, method, bucket, key, query, headers, when):
    """OSS V4 (OSS4-HMAC-SHA256) Authorization header; `headers` hold the x-oss-* ones."""
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    scope = f"{stamp[:8]}/{region}/oss/aliyun_v4_request"
    signed = sorted(
        (k.lower(), v)
        for k, v in headers.items()
        if k.lower().startswith("x-oss-") or k.lower() in ("content-type", "content-md5")
    )
    canonical = "\n".join(
        [
            method,
            urllib.parse.quote(f"/{bucket}/{key}", safe="/"),
            "&".join(
                k + ("=" + v if v else "")
                for k, v in sorted((_quote(k), _quote(v)) for k, v in query.items())
            ),
            "".join(f"{k}:{v}\n" for k, v in signed),
            "",
            headers.get("x-oss-content-sha256", "UNSIGNED-PAYLOAD"),
        ]
    )
    to_sign = "\n".join(
        ["OSS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    k = ("aliyun_v4" + secret).encode()
    for part in (stamp[:8], region, "oss", "aliyun_v4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    return f"OSS4-HMAC-SHA256 Credential={ak}/{scope},Signature={signature}"


class Alicloud:
    """ESS, CloudMonitor (RPC signature v1) and OSS (V4) signed here with the RAM role's STS
    credentials from the metadata service; ESS hands lifecycle tokens out per scaling activity."""

    def __init__(self, cfg):
        self.cfg, self.region, self.endpoints = cfg, cfg["region"], cfg.get("endpoints") or {}
        self.imds = Imds(
            self.endpoints.get("imds", "http://100.100.100.200"),
            "X-aliyun-ecs-metadata-token",
            "X-aliyun-ecs-metadata-token-ttl-seconds",
        )
        self._creds, self._ids = None, {}

    def identity(self):
        m = self.imds.get
        ident = {
            "instance_id": m("instance-id"),
            "region": m("region-id", self.region),
            "instance_type": m("instance/instance-type"),
            "spot": None,
            "target": None,
        }
        if self.cfg.get("group_name"):
            inst = self.scaling_instance(ident["instance_id"])
            ident["spot"] = inst.get("SpotStrategy", "NoSpot") not in ("NoSpot", "")
            ident["target"] = self._target(inst)
        return ident

    def credentials(self):
        if not self._creds or time.time() > self._creds["refresh"]:
            role = self.imds.get("ram/security-credentials/").split()[0]
            self._creds = dict(
                json.loads(self.imds.get("ram/security-credentials/" + role)),
                refresh=time.time() + 600,
            )
        return self._creds

    def rpc(self, service, version, action, **params):
        default = {
            "ess": "https://ess.aliyuncs.com",
            "cms": f"https://metrics.{self.region}.aliyuncs.com",
        }
        return rpc_call(
            self.endpoints.get(service, default[service]),
            version,
            action,
            self.credentials(),
            self.region,
            **params,
        )

    def ess(self, action, **params):
        return self.rpc("ess", "2014-08-28", action, **params)

    def group_id(self):
        if "group" not in self._ids and self.cfg.get("group_id"):
            self._ids["group"] = self.cfg["group_id"]
        if "group" not in self._ids:
            found = self.ess("DescribeScalingGroups", ScalingGroupName=self.cfg["group_name"])
            groups = found.get("ScalingGroups", {}).get("ScalingGroup", [])
            if not groups:
                raise RuntimeError(f"no scaling group {self.cfg['group_name']} in {self.region}")
            self._ids["group"] = groups[0]["ScalingGroupId"]
        return self._ids["group"]

    def scaling_instance(self, instance_id):
        found = self.ess(
            "DescribeScalingInstances",
            ScalingGroupId=self.group_id(),
            **{"InstanceId.1": instance_id},
        )
        items = found.get("ScalingInstances", {}).get("ScalingInstance", [])
        return items[0] if items else {}

    @staticmethod
    def _target(inst):
        # No target-lifecycle-state in ECS metadata: the group's view of this node instead.
        state = inst.get("LifecycleState")
        return (
            "Terminated"
            if state in ("Removing:Wait", "Removing")
            else ("InService" if inst else None)
        )

    def target_state(self):
        return self._target(self.scaling_instance(self.imds.get("instance-id")))

    def _action(self, hook, instance_id):
        """(hook id, token) of the pending action of `hook` for this node: look through the
        node's own scaling activity, then the group's activities in progress."""
        if hook not in self._ids:
            hooks = self.ess(
                "DescribeLifecycleHooks", ScalingGroupId=self.group_id(), LifecycleHookName=hook
            )
            found = hooks.get("LifecycleHooks", {}).get("LifecycleHook", [])
            if not found:
                raise RuntimeError(f"scaling group {self.group_id()} has no lifecycle hook {hook}")
            self._ids[hook] = found[0]["LifecycleHookId"]
        acts = self.ess(
            "DescribeScalingActivities",
            ScalingGroupId=self.group_id(),
            StatusCode="InProgress",
            PageSize=50,
        )
        ids = [self.scaling_instance(instance_id).get("ScalingActivityId")] + [
            a["ScalingActivityId"]
            for a in acts.get("ScalingActivities", {}).get("ScalingActivity", [])
        ]
        for activity in dict.fromkeys(i for i in ids if i):
            found = self.ess(
                "DescribeLifecycleActions",
                ScalingActivityId=activity,
                LifecycleActionStatus="Pending",
                MaxResults=50,
            )
            for act in found.get("LifecycleActions", {}).get("LifecycleAction", []):
                if act.get("LifecycleHookId") == self._ids[hook] and instance_id in act.get(
                    "InstanceIds", {}
                ).get("InstanceId", []):
                    return self._ids[hook], act["LifecycleActionToken"]
        raise RuntimeError(f"no pending {hook} action for {instance_id}")

    def lifecycle(self, hook, result, instance_id):
        hook_id, token = self._action(hook, instance_id)
        self.ess(
            "CompleteLifecycleAction",
            LifecycleHookId=hook_id,
            LifecycleActionToken=token,
            LifecycleActionResult=result,
            ClientToken=uuid.uuid4().hex,
        )

    def heartbeat(self, hook, instance_id):
        hook_id, token = self._action(hook, instance_id)
        self.ess(
            "RecordLifecycleActionHeartbeat",
            LifecycleHookId=hook_id,
            LifecycleActionToken=token,
            heartbeatTimeout=600,
        )

    def put_metrics(self, values):
        """To the stack's CloudMonitor application group, keyed the way ESS alarms on custom
        metrics match a group (dimension `scaling_group`)."""
        params, stamp = {}, str(int(time.time() * 1000))
        for i, (name, (value, _unit)) in enumerate(sorted(values.items()), 1):
            item = {
                "MetricName": name,
                "Type": "0",
                "GroupId": self.cfg.get("metrics_group_id") or "0",
                "Time": stamp,
                "Dimensions": json.dumps({"scaling_group": self.group_id()}),
                "Values": json.dumps({"value": float(value)}),
            }
            params.update({f"MetricList.{i}.{k}": v for k, v in item.items()})
        self.rpc("cms", "2019-01-01", "PutCustomMetric", **params)

    def fetch(self, bucket, key, dest):
        c, when = self.credentials(), datetime.datetime.now(datetime.timezone.utc)
        headers = {
            "x-oss-date": when.strftime("%Y%m%dT%H%M%SZ"),
            "x-oss-content-sha256": "UNSIGNED-PAYLOAD",
        }
        if c.get("SecurityToken"):
            headers["x-oss-security-token"] = c["SecurityToken"]
        headers["Authorization"] = oss_v4_authorization(
            c["AccessKeyId"],
            c["AccessKeySecret"],
            self.region,
            "GET",
            bucket,
            key,
            {},
            headers,
            when,
        )
        base = self.endpoints.get(
            "oss", f"https://{bucket}.oss-{self.region}-internal.aliyuncs.com"
        )
        req = urllib.request.Request(base + "/" + urllib.parse.quote(key), headers=headers)
        with urllib.request.urlopen(req, timeout=60) as resp, open(dest, "wb") as out:
            shutil.copyfileobj(resp, out, 1 << 20)


# <<< cloud alicloud


def cloud_of(cfg):
    return globals()[{"aws": "Aws", "alicloud": "Alicloud"}[cfg["cloud"]]](cfg)


def apt_install(packages):
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["dpkg", "--configure", "-a"], env=env)  # a reboot during dpkg leaves it half-configured
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    if run(install, env=env).returncode == 0:
        return True
    run(["apt-get", "update", "-q"], env=env)
    return run(install, env=env).returncode == 0


def controller():
    """The Python that runs Ansible: python3 when the pins cover it, else python3.9 from the
    archive (Ubuntu 20.04's 3.8)."""
    version = sys.version_info[:2]
    if version in PINS:
        return sys.executable, version
    if version < (3, 9) and apt_install(["python3.9", "python3.9-venv"]):
        return "/usr/bin/python3.9", (3, 9)
    pins(version, "")  # raises the explanation
    raise AssertionError(version)


def ensure_venv(cfg):
    python, version = controller()
    reqs = pins(version, cfg["cloud"])
    stamp = os.path.join(VENV, ".torchfleet-pins")
    want = hashlib.sha256(" ".join([python, *reqs, *cfg.get("pip_args", [])]).encode()).hexdigest()
    if read_json(stamp) == want:
        return
    shutil.rmtree(VENV, ignore_errors=True)
    if run([python, "-m", "venv", VENV]).returncode != 0:
        package = "python{}.{}-venv".format(*version)
        if not apt_install([package]) or run([python, "-m", "venv", VENV]).returncode != 0:
            raise Failure("venv", f"cannot create {VENV} with {python} (is {package} installable?)")
    pip = [VENV + "/bin/python", "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    if run(pip + list(cfg.get("pip_args") or []) + reqs).returncode != 0:
        raise Failure("venv", "pip could not install the bootstrap pins: " + " ".join(reqs))
    write_json(stamp, want)


def in_venv():
    return os.path.realpath(sys.prefix) == os.path.realpath(VENV)


def reexec_in_venv(argv):
    """Continue in the bootstrap venv's interpreter (boto3), same script, same command."""
    if not in_venv():
        os.execv(VENV + "/bin/python", [VENV + "/bin/python", os.path.abspath(__file__), *argv])


def fetch_bundle(cfg, cloud, state):
    bundle = os.path.join(WORK, "bundle.tar.gz")
    want = cfg["bundle_sha256"]
    if not (os.path.exists(bundle) and sha256_file(bundle) == want):
        os.makedirs(WORK, exist_ok=True)
        cloud.fetch(cfg["bundle_bucket"], cfg["bundle_key"], bundle + ".part")
        got = sha256_file(bundle + ".part")
        if got != want:
            raise Failure(
                "verify",
                f"bundle {cfg['bundle_bucket']}/{cfg['bundle_key']} has sha256 {got}, "
                f"expected {want} (the stack's bundle_sha256): refusing to run it",
            )
        os.replace(bundle + ".part", bundle)
    state.stage("unpack")
    tree = os.path.join(WORK, "bundle-" + want[:16])
    if not os.path.isfile(os.path.join(tree, "manifest.json")):
        shutil.rmtree(tree + ".tmp", ignore_errors=True)
        with tarfile.open(bundle) as tar:
            for m in tar.getmembers():  # our own verified archive; still refuse any escape
                if (
                    m.name.startswith(("/", ".."))
                    or "/../" in m.name
                    or not (m.isfile() or m.isdir())
                ):
                    raise Failure(
                        "unpack", f"bundle member {m.name!r} is not a plain relative path"
                    )
            tar.extractall(tree + ".tmp")
        shutil.rmtree(tree, ignore_errors=True)
        os.replace(tree + ".tmp", tree)
    return tree


def write_inventory(cfg, ident, tree):
    """The operator's inventory shape: gpu_nodes with the stack facts as group vars, this
    node's facts (from its metadata) as host vars, the stack's group_vars/ beside it."""
    node = read_json(os.path.join(tree, "node.json"))
    manifest = read_json(os.path.join(tree, "manifest.json"))
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "/usr/bin/python3",
        "torchfleet_instance_type": ident["instance_type"],
    }
    itype = node["instance_types"].get(ident["instance_type"] or "")
    # Not a catalog type: preflight detects the GPU and its capability itself.
    host.update(
        {"torchfleet_gpu_model": itype["gpu_model"]}
        if itype
        else {"torchfleet_gpu_model": "", "torchfleet_compute_capability": ""}
    )
    if ident.get("spot") is not None:
        host["torchfleet_spot"] = ident["spot"]
    inv = os.path.join(WORK, "inventory")
    os.makedirs(inv, exist_ok=True)
    link = os.path.join(inv, "group_vars")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.join(tree, "inventories", manifest["stack"], "group_vars"), link)
    write_json(
        os.path.join(inv, "hosts.json"),
        {
            "all": {
                "children": {
                    "gpu_nodes": {"vars": node["group_vars"], "hosts": {ident["instance_id"]: host}}
                }
            }
        },
    )
    # What must win over the stack's settings: the bundle's wheel, model downloads through
    # this agent, the port the load balancer checks.
    fetch = ["/usr/bin/python3", os.path.abspath(__file__), "fetch"]
    write_json(
        os.path.join(WORK, "node-vars.json"),
        {
            "inference_runtime_wheel": os.path.join(tree, manifest["runtime_wheel"]),
            "inference_runtime_s3_command": fetch,
            "inference_runtime_oss_command": fetch,
            "inference_runtime_port": cfg.get("service_port", 8080),
        },
    )
    return os.path.join(inv, "hosts.json")


def ansible(tree, inventory, playbook, state):
    """Run a bundle playbook on this node; the failing task comes from the bundle's callback
    plugin (torchfleet_status), not from parsing Ansible's output."""
    status = os.path.join(WORK, "ansible-status.json")
    if os.path.exists(status):
        os.remove(status)
    env = dict(
        os.environ,
        ANSIBLE_ROLES_PATH=os.path.join(tree, "roles"),
        ANSIBLE_CALLBACK_PLUGINS=os.path.join(tree, "bootstrap", "callback_plugins"),
        ANSIBLE_CALLBACKS_ENABLED="torchfleet_status",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        ANSIBLE_HOME=WORK + "/ansible",
        ANSIBLE_LOCAL_TEMP=WORK + "/ansible/tmp",
        ANSIBLE_DEPRECATION_WARNINGS="0",
        ANSIBLE_NO_TARGET_SYSLOG="1",
        TORCHFLEET_STATUS_FILE=status,
        HOME="/root",
        PATH=VENV + "/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    )
    env.pop("ANSIBLE_CONFIG", None)
    started = time.time()
    rc = run(
        [
            VENV + "/bin/ansible-playbook",
            "-i",
            inventory,
            "-e",
            f"@{WORK}/node-vars.json",
            os.path.join(tree, "playbooks", playbook),
        ],
        env=env,
        cwd=tree,
    ).returncode
    report = read_json(status, {}) or {}
    state.update(
        plays=[
            *(state["plays"] or []),
            {
                "playbook": playbook,
                "rc": rc,
                "seconds": round(time.time() - started, 1),
                "stats": report.get("stats"),
            },
        ]
    )
    if rc != 0:
        failed = report.get("failed") or {}
        task = failed.get("task") or report.get("task") or "unknown (see the journal)"
        raise Failure(
            "site",
            f"{playbook} failed at task '{task}': {failed.get('msg', f'rc {rc}')}",
            task=task,
        )


def reboot_pending():
    """A reboot the configuration asked for: the distro's flag, or an NVIDIA driver installed
    but not loaded (the nvidia_driver role refuses to reboot a node from a local play)."""
    if os.path.exists(REBOOT_FLAG):
        return REBOOT_FLAG
    if (
        not os.path.exists("/proc/driver/nvidia/version")
        and shutil.which("modinfo")
        and run(["modinfo", "-F", "version", "nvidia"], capture_output=True).returncode == 0
    ):
        return "the NVIDIA driver is installed but not loaded"
    return None


def wait_ready(cfg, timeout=900):
    url = f"http://127.0.0.1:{cfg.get('service_port', 8080)}/readyz"
    deadline = time.time() + timeout
    while True:
        try:
            if http("GET", url, timeout=5)[0] == 200:
                return
        except OSError:
            pass
        if time.time() > deadline:
            raise Failure("ready-wait", f"{url} did not answer 200 within {timeout} s")
        time.sleep(2)


def heartbeats(cfg, cloud, ident, stop):
    """Keep the launch action alive while a slow node configures itself."""
    while not stop.wait(HEARTBEAT_S):
        try:
            cloud.heartbeat(cfg["launch_hook"], ident["instance_id"])
        except Exception as err:  # a missed heartbeat is not a failed node
            log(f"lifecycle heartbeat failed: {err}")


def complete(cfg, cloud, ident, hook, result, state):
    if not (cfg.get("group_name") and cfg.get(hook) and ident.get("target")):
        return
    try:
        cloud.lifecycle(cfg[hook], result, ident["instance_id"])
    except Exception as err:
        if result == "CONTINUE":
            raise Failure("lifecycle", f"completing {cfg[hook]} failed: {err}") from err
        log(
            f"could not {result} {cfg[hook]} ({err}): the hook's default result applies at its timeout"
        )
        return
    log(f"lifecycle {cfg[hook]} -> {result}")
    state.update(lifecycle=dict(state["lifecycle"] or {}, **{cfg[hook]: result}))


def this_machine(state):
    """Whether the state file is this machine's (an image may carry its builder's)."""
    try:
        with open(CLOUD_INSTANCE_ID) as f:
            local = f.read().strip()
    except OSError:
        return True  # no cloud-init record to compare with
    return (state["identity"] or {}).get("instance_id") == local


def start_watchers(cfg):
    """Started by the bootstrap, never at boot on their own: a node leaving a stopped warm
    pool gets its launch action completed by the bootstrap, once."""
    if cfg.get("group_name"):
        run(["systemctl", "start", *WATCHERS])


def bootstrap(argv):
    cfg = read_json(CONFIG)
    if not cfg:
        log(f"no {CONFIG}: nothing to do")
        return 1
    state = State()
    if (
        state["state"] == "ready"
        and state["bundle_sha256"] == cfg["bundle_sha256"]
        and this_machine(state)
    ):
        log(f"already ready with bundle {cfg['bundle_sha256'][:12]}")
        start_watchers(cfg)
        return 0
    cloud = cloud_of(cfg)
    if not in_venv():  # the first process of this boot: a fresh bootstrap or a resumed one
        resumed = state["state"] == "running" and state["bundle_sha256"] == cfg["bundle_sha256"]
        fresh = (
            {}
            if resumed
            else {
                "started": now(),
                "started_epoch": time.time(),
                "stages": {},
                "plays": [],
                "reboots": 0,
                "lifecycle": {},
            }
        )
        state.update(
            state="running",
            mode="baked" if state["state"] == "warmed" else cfg.get("mode", "cold"),
            bundle_sha256=cfg["bundle_sha256"],
            failed_task=None,
            error=None,
            finished=None,
            boots=(state["boots"] or 0) + 1 if resumed else 1,
            **fresh,
        )
    ident, stop = state["identity"], threading.Event()
    try:
        if not in_venv():
            state.stage("identity")
            ident = cloud.identity()
            state.update(identity=ident)
            log(
                "instance {instance_id} ({instance_type}) in {region}, target {target}".format(
                    **ident
                )
            )
            state.stage("venv")
            if (
                os.listdir("/var/lib/dpkg/updates")
                if os.path.isdir("/var/lib/dpkg/updates")
                else []
            ):
                run(["dpkg", "--configure", "-a"])  # a reboot in the middle of a dpkg run
            ensure_venv(cfg)
            if cfg["cloud"] == "aws":
                reexec_in_venv(argv)
        if cfg.get("launch_hook") and ident.get("target"):
            threading.Thread(target=heartbeats, args=(cfg, cloud, ident, stop), daemon=True).start()
        state.stage("fetch")
        tree = fetch_bundle(cfg, cloud, state)
        state.stage("facts")
        inventory = write_inventory(cfg, ident, tree)
        state.stage("site")
        try:
            if state["mode"] == "baked":
                try:
                    ansible(tree, inventory, "baked.yml", state)
                except Failure as err:  # an image older than this bundle: configure it fully
                    log(f"baked path failed ({err.message}): running site.yml")
                    state.update(baked_fallback=err.task)
                    ansible(tree, inventory, "site.yml", state)
            else:
                ansible(tree, inventory, "site.yml", state)
        except Failure as err:
            # A new NVIDIA driver stops a local play (nvidia_driver: "reboot by hand, then run
            # the playbook again"): that is what this unit does, not a failed node.
            if not reboot_pending() or (state["reboots"] or 0) >= MAX_REBOOTS:
                raise
            log(f"{err.message}: a reboot is pending, the play resumes after it")
        why = reboot_pending()
        if why and (state["reboots"] or 0) < MAX_REBOOTS:
            state.update(reboots=(state["reboots"] or 0) + 1, reboot_reason=why)
            state.stage("reboot")
            log(f"rebooting ({why}); this unit resumes the bootstrap on the next boot")
            run(["systemctl", "reboot"])
            return 0
        if state["mode"] == "bake":
            state.stage("prepare-image")
            return prepare_image(state, cfg.get("poweroff", True))
        state.stage("ready-wait")
        wait_ready(cfg)
        stop.set()
        state.stage("lifecycle")
        complete(cfg, cloud, ident, "launch_hook", "CONTINUE", state)
        start_watchers(cfg)
        final = "warmed" if (ident.get("target") or "").startswith("Warmed:") else "ready"
        state.stage(final)
        state.update(
            state=final, finished=now(), seconds=round(time.time() - state["started_epoch"], 1)
        )
        log(f"{final} in {state['seconds']:.0f} s (mode {state['mode']})")
        return 0
    except Exception as err:  # every failure is reported, named, and abandons the launch
        stop.set()
        if not isinstance(err, Failure):
            err = Failure(state["stage"], f"{type(err).__name__}: {err}")
        state.update(
            state="failed", stage=err.stage, failed_task=err.task, error=err.message, finished=now()
        )
        log(f"FAILED in stage {err.stage}: {err.message}")
        if ident and cfg["cloud"] == "aws" and not in_venv():
            if not os.path.exists(VENV + "/bin/python"):
                log("no bootstrap venv, no SDK: the launch hook's default result (ABANDON) applies")
                return 1
            reexec_in_venv(["abandon"])
        if ident:
            complete(cfg, cloud, ident, "launch_hook", "ABANDON", state)
        return 1


def abandon(_argv):
    cfg, state = read_json(CONFIG), State()
    complete(cfg, cloud_of(cfg), state["identity"] or {}, "launch_hook", "ABANDON", state)
    return 1


def lifecycle_watch(_argv):
    cfg = read_json(CONFIG)
    cloud = cloud_of(cfg)
    while True:
        try:
            target, state = cloud.target_state(), State()
            ident = dict(state["identity"] or {}, target=target)
            if target == "Terminated":
                log("terminating: draining the runtime")
                state.update(state="terminating")
                run(
                    ["systemctl", "stop", RUNTIME]
                )  # SIGTERM: /readyz 503, in-flight requests finish
                complete(cfg, cloud, ident, "terminate_hook", "CONTINUE", state)
                return 0
            if target == "InService" and state["state"] == "warmed":  # a running warm pool node
                wait_ready(cfg)
                complete(cfg, cloud, ident, "launch_hook", "CONTINUE", state)
                state.update(state="ready", stage="ready", finished=now())
        except Exception as err:
            log(f"lifecycle watch: {err}")
        time.sleep(WATCH_POLL_S[cfg["cloud"]])


def scrape(text, previous=None, now_s=None):
    """The scaling metrics from the runtime's /metrics text: QueueDepth (instances waiting),
    GpuUtilization (percent, mean over GPUs, when NVML reports), RequestRate (requests answered
    per second since `previous`, the last sample {"t", "requests"}). Returns (values, sample)."""
    queue, gpus, requests = 0.0, [], 0.0
    for line in text.splitlines():
        if line.startswith("torchfleet_queue_depth "):
            queue = float(line.split()[1])
        elif line.startswith("torchfleet_gpu_utilization_ratio{"):
            gpus.append(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("torchfleet_requests_total{"):
            requests += float(line.rsplit(" ", 1)[1])
    values = {"QueueDepth": (queue, "Count")}
    if gpus:
        values["GpuUtilization"] = (100.0 * sum(gpus) / len(gpus), "Percent")
    sample = {"t": time.time() if now_s is None else now_s, "requests": requests}
    if (
        previous and sample["t"] > previous["t"] and requests >= previous["requests"]
    ):  # else: a restart
        values["RequestRate"] = (
            (requests - previous["requests"]) / (sample["t"] - previous["t"]),
            "Count/Second",
        )
    return values, sample


def publish_metrics(_argv):
    cfg = read_json(CONFIG)
    if not cfg.get("group_name") or State()["state"] != "ready":
        return 0
    try:
        text = http("GET", f"http://127.0.0.1:{cfg.get('service_port', 8080)}/metrics", timeout=5)[
            1
        ]
    except OSError as err:
        log(f"no metrics from the runtime: {err}")
        return 0
    values, sample = scrape(text.decode(), read_json(METRICS_SAMPLE))
    write_json(METRICS_SAMPLE, sample)
    cloud_of(cfg).put_metrics(values)
    return 0


def fetch(argv):
    src, dest = argv
    parts = urllib.parse.urlsplit(src)
    cloud_of(read_json(CONFIG)).fetch(parts.netloc, parts.path.lstrip("/"), dest)
    return 0


def prepare_image(state=None, poweroff=True):
    """Bake: keep packages, venvs, torch and the runtime; drop the model and everything that
    makes a node unique (cloud-init's instance, machine-id, SSH host keys, this state); power
    off, or (an image builder captures a running machine) end with a state "ready" that names
    no instance, so no node booted from the image takes it for its own."""
    state = state or State()
    record = {k: state[k] for k in ("bundle_sha256", "mode", "started", "stages", "plays")}
    run(["systemctl", "stop", *WATCHERS])
    run(["systemctl", "disable", "--now", RUNTIME])  # a baked node starts it once its model is in
    for path in (MODELS, WORK, RUNTIME_CACHE):
        shutil.rmtree(path, ignore_errors=True)
    write_json(
        IMAGE_RECORD,
        {
            "baked": now(),
            "bundle_sha256": state["bundle_sha256"],
            "from_instance": (state["identity"] or {}).get("instance_id"),
        },
    )
    for path in (CONFIG, STATE):
        if os.path.exists(path):
            os.remove(path)
    if shutil.which("cloud-init") and run(["cloud-init", "clean", "--logs"]).returncode != 0:
        raise Failure(
            "prepare-image",
            "cloud-init clean failed (see the journal): the image would "
            "not run cloud-init for the next instance",
        )
    shutil.rmtree(CLOUD_SEED, ignore_errors=True)  # a builder's NoCloud seed, unless mounted
    for path in MACHINE_IDS:
        if os.path.isfile(path) and not os.path.islink(path):
            open(path, "w").close()  # empty: systemd makes a new one on the first boot
    for name in os.listdir(SSH_DIR) if os.path.isdir(SSH_DIR) else []:
        if name.startswith("ssh_host_"):
            os.remove(os.path.join(SSH_DIR, name))
    run(["journalctl", "--rotate"])
    run(["journalctl", "--vacuum-time=1s"])
    if not poweroff:
        write_json(STATE, dict(record, state="ready", stage="baked", finished=now()))
        log("image prepared: ready for capture")
        return 0
    log("image prepared: powering off")
    run(["systemctl", "poweroff"])
    return 0


def status(_argv):
    print(json.dumps(State().doc, indent=2, sort_keys=True))
    return 0


COMMANDS = {
    "bootstrap": bootstrap,
    "abandon": abandon,
    "lifecycle-watch": lifecycle_watch,
    "publish-metrics": publish_metrics,
    "fetch": fetch,
    "status": status,
    "prepare-image": lambda _argv: prepare_image(),
}


def main(argv):
    if not argv or argv[0] not in COMMANDS:
        print("usage: torchfleet-node " + "|".join(COMMANDS), file=sys.stderr)
        return 2
    if (
        argv[0] in ("abandon", "lifecycle-watch", "publish-metrics", "fetch")
        and (read_json(CONFIG) or {}).get("cloud") == "aws"
    ):
        reexec_in_venv(argv)
    return COMMANDS[argv[0]](argv if argv[0] == "bootstrap" else argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
