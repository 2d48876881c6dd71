#!/usr/bin/env bash
# One-command set-up: system packages the tests need (as root on Debian), then .venv with every
# pinned Python dependency, torchfleet-compat, the runtime, the `torchfleet` and `torchfleet-bench`
# commands installed editable.
# Re-running it changes nothing and returns in about a second: each step checks before it acts.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
# podman + runc run the systemd containers Molecule converges; debootstrap builds their images
# (no registry is reachable); uidmap/slirp4netns/fuse-overlayfs are podman's helpers, catatonit
# builds the pause image of a pod (the bootstrap test runs its node and fakes in one).
APT_PACKAGES=(podman runc debootstrap uidmap slirp4netns fuse-overlayfs catatonit iproute2 curl openssh-client)
# Debian's Prometheus stack for tests/monitoring: promtool (rule checks and unit tests) and the
# real prometheus, alertmanager and node exporter binaries the tests run on loopback. Wanted
# for their programs only: on a booted machine apt would start their services listening on
# every interface, so the ones this run installs are stopped and disabled again.
BINARY_ONLY_PACKAGES=(prometheus prometheus-alertmanager prometheus-node-exporter)
APT_PACKAGES+=("${BINARY_ONLY_PACKAGES[@]}")
# Debian's Chromium: tests/docs/ loads the docs site in it, headless, through Playwright (which
# downloads no browser of its own).
APT_PACKAGES+=(chromium)
# HAProxy: the local fleet's load balancer (infra/deploy/balancer.py; the demo and the edge
# tests run it themselves, so its own service is disabled like the ones above); openssl's
# s_client proves old TLS versions are refused.
APT_PACKAGES+=(haproxy openssl)
BINARY_ONLY_PACKAGES+=(haproxy)

log() { printf '[setup] %s\n' "$*"; }

install_system_packages() {
  if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
    log "not root on Debian: skipping system packages (${APT_PACKAGES[*]}); Molecule needs them"
    return
  fi
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "system packages present"
    return
  fi
  log "installing system packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ -d /run/systemd/system ]; then
    for p in "${missing[@]}"; do
      case " ${BINARY_ONLY_PACKAGES[*]} " in
        *" $p "*) systemctl disable --now "$p" >/dev/null 2>&1 || true ;;
      esac
    done
  fi
}

install_python_packages() {
  # one requirements file per purpose; constraints.txt is the lock over all of them
  local reqs=()
  for r in requirements/*.txt; do [ "$r" = requirements/constraints.txt ] || reqs+=("$r"); done
  local stamp="$VENV/.torchfleet-setup"
  local want
  local inputs=("${reqs[@]}")
  for f in requirements/constraints.txt compat/pyproject.toml runtime/pyproject.toml benchmarks/pyproject.toml pyproject.toml; do [ -f "$f" ] && inputs+=("$f"); done
  want=$(cat "${inputs[@]}" | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    log "$VENV up to date"
    return
  fi
  [ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
  local args=()
  for r in "${reqs[@]}"; do args+=(-r "$r"); done
  # constraints.txt pins every transitive dependency (regenerate with `make lock`).
  if [ -f requirements/constraints.txt ]; then args+=(-c requirements/constraints.txt); fi
  # torchfleet-compat (node compatibility): infra imports it, the runtime depends on it
  if [ -f compat/pyproject.toml ]; then args+=(-e ./compat); fi
  if [ -f runtime/pyproject.toml ]; then args+=(-e ./runtime); fi
  # the repository root: infra/ and the `torchfleet` command (up | down | status | plan | demo)
  args+=(-e .)
  # benchmarks/: the `torchfleet-bench` command (load generator and benchmarks; never on a node)
  if [ -f benchmarks/pyproject.toml ]; then args+=(-e ./benchmarks); fi
  log "installing pinned Python dependencies into $VENV"
  "$VENV/bin/python" -m pip install -q "${args[@]}"
  echo "$want" >"$stamp"
}

install_system_packages
install_python_packages
log "done"
