#!/usr/bin/env bash
# Print deploy/netagent.yaml with --iface=IFACE added to the agent's arguments, right after
# its --backend (deploy/README.md, "Prepare the cluster, then apply", step 3: the underlay is
# the default route's interface unless told otherwise). control-plane.sh pipes it into
# `kubectl apply -f -`; tests/unit/test_vagrant.py checks it against the real manifest.
#
#     manifest.sh IFACE        # NETAGENT_SRC=DIR: the checkout (default: this script's)
set -euo pipefail
if [ $# -ne 1 ] || ! [[ $1 =~ ^[A-Za-z0-9._-]{1,15}$ ]]; then
  echo "usage: $0 IFACE (an interface name)" >&2
  exit 2
fi
iface=$1
src=${NETAGENT_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
manifest=$src/deploy/netagent.yaml

out=$(sed "s|^\( *\)- --backend=.*$|&\n\1- --iface=$iface|" "$manifest")
if [ "$(grep -c -e "^ *- --iface=$iface\$" <<<"$out")" -ne 1 ]; then
  echo "manifest.sh: $manifest has not exactly one '- --backend=' argument to add --iface after" >&2
  exit 1
fi
printf '%s\n' "$out"
