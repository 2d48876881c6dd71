#!/usr/bin/env bash
# Build (once) the systemd container image the role tests run in: localhost/torchfleet-SUITE:latest.
# No container registry is reachable, so the image is debootstrapped from the host's own Debian
# mirror and imported into podman. The host's extra CA certificates go into the image, because
# this network inspects TLS (and nodes behind corporate proxies need the same).
#   scripts/build_image.sh bookworm|bullseye [--force]
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE=${1:?usage: $0 bookworm|bullseye [--force]}
FORCE=${2:-}
case "$SUITE" in bookworm|bullseye) ;; *) echo "unknown suite '$SUITE' (allowed: bookworm, bullseye)" >&2; exit 2 ;; esac
IMAGE="localhost/torchfleet-$SUITE:latest"
CACHE="$PWD/.cache/images"
mkdir -p "$CACHE"

# One builder at a time per suite (tests and people may ask for the same image together).
exec 9>"$CACHE/$SUITE.lock"
flock 9

if [ "$FORCE" != "--force" ] && podman image exists "$IMAGE"; then
  echo "[image] $IMAGE present"
  exit 0
fi

# The Debian mirror the host already uses (deb822 .sources or one-line sources.list).
debian_mirror() {
  local uri
  uri=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
        | grep -oE '(https?|file)://[^ ]+' | grep -E '/debian/?$' | head -n1 || true)
  echo "${uri%/}"
}
MIRROR=${TORCHFLEET_DEBIAN_MIRROR:-$(debian_mirror)}
[ -n "$MIRROR" ] || { echo "no Debian mirror found in the host's apt sources; set TORCHFLEET_DEBIAN_MIRROR" >&2; exit 1; }
SECURITY_MIRROR="${MIRROR%/debian}/debian-security"

ROOTFS="$CACHE/$SUITE-rootfs"
rm -rf "$ROOTFS"
start=$(date +%s)
echo "[image] debootstrap $SUITE from $MIRROR"
# python3-apt lets Ansible's apt module run without bootstrapping itself on every converge.
# openssh-server: the Molecule scenarios reach the node the way production does, Ansible over
# SSH with pipelining (one exec per task), through a port published on 127.0.0.1 only.
debootstrap --variant=minbase \
  --include=python3,python3-apt,systemd,systemd-sysv,sudo,ca-certificates,iproute2,procps,openssh-server \
  "$SUITE" "$ROOTFS" "$MIRROR" >"$CACHE/$SUITE-debootstrap.log" 2>&1 \
  || { tail -n 20 "$CACHE/$SUITE-debootstrap.log" >&2; exit 1; }

if [ "$SUITE" = bookworm ]; then components="main non-free-firmware"; else components="main"; fi
cat >"$ROOTFS/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE $components
deb $MIRROR $SUITE-updates $components
deb $SECURITY_MIRROR $SUITE-security $components
SOURCES

if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
  chroot "$ROOTFS" update-ca-certificates >/dev/null 2>&1
fi
# A container boots fast and quiet without these.
for unit in getty@tty1.service systemd-logind.service systemd-timesyncd.service; do
  ln -sf /dev/null "$ROOTFS/etc/systemd/system/$unit"
done
: >"$ROOTFS/etc/machine-id"
# sshd starts with systemd (the package enables ssh.service); the test key is the only way in.
# The host keys made at install time are shared by every container of this image, which is
# fine for throwaway test nodes (the scenarios don't pin host keys).
[ -e "$ROOTFS/etc/systemd/system/multi-user.target.wants/ssh.service" ] \
  || ln -sf /lib/systemd/system/ssh.service "$ROOTFS/etc/systemd/system/multi-user.target.wants/ssh.service"
cat >"$ROOTFS/etc/ssh/sshd_config.d/torchfleet-test.conf" <<'SSHD'
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
SSHD
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*

echo "[image] importing $IMAGE"
tar -C "$ROOTFS" -c . | podman import --change 'CMD ["/sbin/init"]' - "$IMAGE" >/dev/null 2>&1
rm -rf "$ROOTFS"
echo "[image] $IMAGE built in $(( $(date +%s) - start )) s"
