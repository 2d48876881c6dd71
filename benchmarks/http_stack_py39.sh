#!/usr/bin/env bash
# `torchfleet-bench http-stack` with the servers on the legacy stack's Python 3.9 (the Debian 11
# image of the Molecule scenarios), the client (wrk) on the host: the container shares the host's
# network, so every candidate is measured by the same client as on the host.
#   benchmarks/http_stack_py39.sh [--duration 5 --rounds 2 ...]   (extra flags go to the bench)
# The candidates' cp39 wheels are downloaded once into .cache/http-bench-cp39 and unpacked into the
# container (no pip or venv needed there); the container is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=${PIP:-.venv/bin/pip}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/tests/roles/containers.conf}
wheels=.cache/http-bench-cp39
if [ ! -f "$wheels/.complete" ]; then
  mkdir -p "$wheels"
  "$PIP" download -q --only-binary=:all: --python-version 3.9 --implementation cp --abi cp39 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$wheels" \
    aiohttp==3.13.5 async-timeout uvicorn==0.39.0 httptools==0.9.0 orjson==3.11.5 h11
  touch "$wheels/.complete"
fi
bash scripts/build_image.sh bullseye >/dev/null
name=torchfleet-runtime-httpbench-$RANDOM$RANDOM
trap 'podman rm -f "$name" >/dev/null 2>&1 || true' EXIT
podman run -d --rm --name "$name" --network host -v "$PWD:$PWD:ro" --entrypoint sleep \
  localhost/torchfleet-bullseye:latest 3600 >/dev/null
podman exec "$name" sh -c "mkdir -p /opt/site && for w in $PWD/$wheels/*.whl; do python3 -m zipfile -e \"\$w\" /opt/site; done"
.venv/bin/python -m torchfleet_bench http-stack \
  --python "podman exec -i -e PYTHONPATH=$PWD/runtime/src:/opt/site $name python3" --label py39 "$@"
