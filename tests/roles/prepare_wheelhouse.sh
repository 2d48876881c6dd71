#!/usr/bin/env bash
# Fill the host-side wheelhouses that the Molecule scenarios mount read-only into their
# containers, so pip inside a container installs offline (--no-index): no multi-GB CUDA build is
# pulled, and the network's TLS-inspection CA never matters. Runs once; later calls return at once.
#
#   tests/roles/prepare_wheelhouse.sh cp311   -> .cache/wheelhouse-cp311 (Debian 12, torch 2.13.0 CPU)
#   tests/roles/prepare_wheelhouse.sh cp39    -> .cache/wheelhouse-cp39  (Debian 11, torch 1.12.1, numpy<2)
#
# The CPU torch wheel comes from the local folder in pip's own configuration (find-links); the
# rest from whatever index pip is configured with. Nothing here names an index host.
set -euo pipefail
cd "$(dirname "$0")/../.."
PIP=${PIP:-.venv/bin/pip}
abi=${1:?usage: $0 cp311|cp39}

# The runtime's own dependencies (runtime/pyproject.toml) come on top of torch and numpy; the HTTP
# parser and the JSON codec are pinned per Python (their last releases with wheels for it).
# nvidia-ml-py is the `gpu` extra (pure Python, one wheel for every Python 3).
runtime_deps=('prometheus-client>=0.16' 'PyYAML>=5.4' 'httptools==0.9.0' 'nvidia-ml-py==13.615.71')
case "$abi" in
  cp311) pyver=3.11; reqs=('torch==2.13.0' 'numpy' "${runtime_deps[@]}" 'orjson==3.13.0') ;;
  cp39) pyver=3.9; reqs=('torch==1.12.1' 'numpy<2' "${runtime_deps[@]}" 'orjson==3.11.5') ;;
  *) echo "unknown wheelhouse '$abi': allowed cp311, cp39" >&2; exit 2 ;;
esac
dest=.cache/wheelhouse-$abi
stamp=$dest/.complete
want=$(printf '%s\n' "${reqs[@]}" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "[wheelhouse] $dest up to date"
  exit 0
fi
mkdir -p "$dest"

links=()
if [ "$abi" = cp311 ]; then
  # The CPU build of torch 2.13.0 lies in pip's configured find-links folder(s).
  for dir in $("$PIP" config list 2>/dev/null | sed -n "s/^[a-z:.]*find-links='\(.*\)'$/\1/p" | sort -u); do
    for whl in "$dir"/torch-2.13.0+cpu-cp311-*.whl; do
      [ -f "$whl" ] && cp -n "$whl" "$dest/"
    done
  done
  compgen -G "$dest/torch-2.13.0+cpu-*.whl" >/dev/null || {
    echo "[wheelhouse] no torch-2.13.0+cpu cp311 wheel in pip's find-links folders" >&2
    exit 1
  }
  links=(--find-links "$dest")
fi

echo "[wheelhouse] downloading ${reqs[*]} for CPython $pyver into $dest"
# Several manylinux tags: Debian 11 has glibc 2.31, Debian 12 glibc 2.36.
"$PIP" download -q --only-binary=:all: --python-version "$pyver" --implementation cp \
  --abi "$abi" --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  "${links[@]}" -d "$dest" "${reqs[@]}"
echo "$want" >"$stamp"
echo "[wheelhouse] $dest ready: $(ls "$dest" | wc -l) wheels"
