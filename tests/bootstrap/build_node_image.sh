#!/usr/bin/env bash
# Build (once) the bare cloud node the bootstrap test boots: a Molecule image
# (localhost/torchfleet-SUITE, scripts/build_image.sh) plus Debian's cloud-init, told to look for
# a NoCloud seed only. Nothing of torchfleet is in it: the test's user-data must do it all.
#   tests/bootstrap/build_node_image.sh [bookworm|bullseye] [--force]
#     -> localhost/torchfleet-SUITE-cloudinit:latest
set -euo pipefail
cd "$(dirname "$0")/../.."
SUITE=${1:-bookworm}
case "$SUITE" in bookworm|bullseye) ;; *) echo "unknown suite '$SUITE' (allowed: bookworm, bullseye)" >&2; exit 2 ;; esac
BASE=localhost/torchfleet-$SUITE:latest
IMAGE=localhost/torchfleet-$SUITE-cloudinit:latest
CACHE="$PWD/.cache/images"
mkdir -p "$CACHE"
exec 9>"$CACHE/$SUITE-cloudinit.lock"
flock 9
if [ "${2:-}" != "--force" ] && podman image exists "$IMAGE"; then
  echo "[image] $IMAGE present"
  exit 0
fi
bash scripts/build_image.sh "$SUITE"
export CONTAINERS_CONF="$PWD/tests/roles/containers.conf"
builder="torchfleet-cloudinit-build-$$"
trap 'podman rm -f "$builder" >/dev/null 2>&1 || true' EXIT
start=$(date +%s)
# apt inside the container: the image's sources point at the host's Debian mirror. `locales`
# with en_US.UTF-8 generated, as on a cloud image: cloud-init's locale module sets it.
podman run --name "$builder" --network host "$BASE" /bin/sh -c '
  set -e
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends cloud-init locales >/dev/null
  sed -i "s/^# *en_US.UTF-8 UTF-8/en_US.UTF-8 UTF-8/" /etc/locale.gen
  locale-gen >/dev/null
  printf "datasource_list: [ NoCloud, None ]\n" >/etc/cloud/cloud.cfg.d/90-torchfleet-test-nocloud.cfg
  rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
  cloud-init --version' >"$CACHE/$SUITE-cloudinit.log" 2>&1 \
  || { tail -n 20 "$CACHE/$SUITE-cloudinit.log" >&2; exit 1; }
podman commit --change 'CMD ["/sbin/init"]' "$builder" "$IMAGE" >/dev/null
echo "[image] $IMAGE built in $(( $(date +%s) - start )) s ($(tail -n1 "$CACHE/$SUITE-cloudinit.log"))"
