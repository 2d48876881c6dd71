#!/bin/sh
# pip install into the image's venv from the build's package sources, one argument each as in
# the pytorch role: WHEELHOUSE (a directory of the build context, mounted at /ctx: offline,
# --no-index), else INDEX_URL (primary index; empty: pip's default) and WHEEL_INDEX (the extra
# index with the CUDA builds of torch). No cache is kept; pip verifies TLS against the system
# bundle, which holds EXTRA_CA_CERTS.
set -eu
if [ -n "${WHEELHOUSE:-}" ]; then
  [ -d "/ctx/$WHEELHOUSE" ] || { echo "WHEELHOUSE=$WHEELHOUSE: not a directory of the build context" >&2; exit 1; }
  set -- --no-index --find-links "/ctx/$WHEELHOUSE" "$@"
else
  if [ -n "${WHEEL_INDEX:-}" ]; then set -- --extra-index-url "$WHEEL_INDEX" "$@"; fi
  if [ -n "${INDEX_URL:-}" ]; then set -- --index-url "$INDEX_URL" "$@"; fi
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# pip's own CA bundle knows nothing of the system's extra certificates.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; fi
exec /opt/torchfleet/venv/bin/python -m pip install "$@"
