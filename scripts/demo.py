"""`make demo`: what torchfleet does, end to end, on this machine — no cloud account, no GPU.

1. Writes the demo model (a small ResNet-style TorchScript CNN) with the runtime's own CLI.
2. Starts `torchfleet-runtime serve` as a real process, times start -> ready (/readyz 200).
3. Sends real predictions over HTTP (JSON and a binary tensor body), and one bad request.
4. Runs a short closed-loop benchmark against it, shows the model card and a few metrics.
5. Stops it with SIGTERM and shows the drain and the exit code.
6. Prints the offline Pulumi plan and cost of the aws-dev stack (mock engine, no cloud calls).
At the end it says plainly what it did not do.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
WORK = ROOT / ".cache" / "demo"


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: bytes | None = None, headers: dict | None = None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, ConnectionError):
        return None, b""


def main() -> int:
    WORK.mkdir(parents=True, exist_ok=True)
    model_dir = WORK / "model"
    cli = str(BIN / "torchfleet-runtime")

    step("1. Demo model (torchfleet-runtime demo-model)")
    subprocess.run([cli, "demo-model", str(model_dir)], check=True)
    meta = json.loads((model_dir / "model.json").read_text())
    print(json.dumps(meta, indent=2))

    step("2. Serve it and wait for readiness (warm-up gates /readyz)")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(WORK / "serve.log", "w")  # noqa: SIM115 - lives as long as the server
    started = time.monotonic()
    proc = subprocess.Popen(
        [cli, "serve", "--model", str(model_dir / "model.pt"), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        while True:
            if proc.poll() is not None:
                print((WORK / "serve.log").read_text()[-3000:])
                print(f"server exited early with code {proc.returncode}")
                return 1
            code, _ = http("GET", base + "/readyz")
            if code == 200:
                break
            if time.monotonic() - started > 120:
                print("server not ready after 120 s")
                return 1
            time.sleep(0.05)
        print(f"ready {time.monotonic() - started:.2f} s after start (load + warm-up of every batch bucket)")
        code, body = http("GET", base + "/v1/model")
        print(f"GET /v1/model -> {code}\n{json.dumps(json.loads(body), indent=2)}")

        step("3. Predictions over real HTTP")
        shape = meta["input_shape"]
        n = 1
        for d in shape:
            n *= d
        instance = [[[((c + y + x) % 7) / 7.0 for x in range(shape[2])] for y in range(shape[1])]
                    for c in range(shape[0])]
        code, body = http("POST", base + "/v1/predict", json.dumps({"inputs": [instance, instance]}).encode(),
                          {"Content-Type": "application/json"})
        out = json.loads(body)["outputs"]
        print(f"JSON   POST /v1/predict (2 instances) -> {code}: {len(out)} x {len(out[0])} logits, "
              f"argmax {[row.index(max(row)) for row in out]}")
        raw = struct.pack(f"<{n * 4}f", *([0.5] * n * 4))
        code, body = http("POST", base + "/v1/predict", raw, {
            "Content-Type": "application/octet-stream",
            "X-Shape": ",".join(str(d) for d in [4, *shape]), "X-Dtype": "float32"})
        print(f"binary POST /v1/predict (4 instances, raw float32) -> {code}: "
              f"{len(json.loads(body)['outputs'])} outputs")
        code, body = http("POST", base + "/v1/predict", b'{"inputs": [1, 2', {"Content-Type": "application/json"})
        print(f"malformed JSON -> {code} {body.decode()}")
        code, _ = http("GET", base + "/livez")
        print(f"and the server keeps serving: /livez -> {code}")

        step("4. Closed-loop benchmark (python -m infra.loadgen, the controller-side load generator)")
        subprocess.run([sys.executable, "-m", "infra.loadgen", base, "--concurrency", "1,8,32", "--requests", "300"],
                       check=False, cwd=ROOT)
        code, body = http("GET", base + "/metrics")
        wanted = ("torchfleet_ready ", "torchfleet_model_load_seconds ", "torchfleet_warmup_seconds ",
                  "torchfleet_batch_size_sum", "torchfleet_batch_size_count", "torchfleet_requests_total{")
        print("GET /metrics (excerpt):")
        for line in body.decode().splitlines():
            if line.startswith(wanted):
                print("  " + line)

        step("5. SIGTERM: drain, then exit")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        print(f"exited with code {rc} {time.monotonic() - t0:.2f} s after SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()

    step("6. Offline Pulumi plan for the aws-dev stack (mock engine, no cloud calls)")
    subprocess.run([str(BIN / "python"), "-m", "infra.plan", "aws-dev"], cwd=ROOT, check=False)

    step("What this demo did not do")
    print(
        "- No cloud: the plan above ran under Pulumi's mock engine; `pulumi up` needs credentials.\n"
        "- No GPU: the model served on CPU in fp32; fp16/bf16 autocast and the memory-sized batch cap\n"
        "  need CUDA (scripts/gpu_check.sh runs them on a GPU machine).\n"
        "- No node configuration: the Ansible roles converge in systemd containers under `make test`\n"
        "  (Molecule), which takes minutes; see README.md."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
