#!/usr/bin/env bash
# What the Vagrant lab takes from deploy/netagent.yaml, so the lab cannot disagree with it:
#   manifest.sh image             the image both containers name (image.sh builds that tag)
#   manifest.sh cluster-cidr      the agent's --cluster-cidr (control-plane.sh: kubeadm's pod network)
#   manifest.sh with-iface IFACE  the manifest with --iface=IFACE added to the agent's arguments,
#                                 right after its --backend (deploy/README.md, "Prepare the
#                                 cluster, then apply", step 3: the underlay is the default
#                                 route's interface unless told otherwise); control-plane.sh
#                                 pipes it into `kubectl apply -f -`
# Each fails unless it finds exactly one value (one --backend line). tests/unit/lab/test_vagrant.py
# runs them on the real manifest.
#
#     manifest.sh image|cluster-cidr|with-iface IFACE     # NETAGENT_SRC=DIR: the checkout
set -euo pipefail
src=${NETAGENT_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
manifest=$src/deploy/netagent.yaml

usage() {
  echo "usage: $0 image | cluster-cidr | with-iface IFACE (an interface name)" >&2
  exit 2
}

# one_value WHAT VALUES: VALUES (lines) on stdout if exactly one, else fail saying WHAT.
one_value() {
  if [ -z "$2" ] || [ "$(printf '%s\n' "$2" | wc -l)" -ne 1 ]; then
    echo "manifest.sh: expected one $1 in $manifest, found: ${2:-none}" >&2
    exit 1
  fi
  printf '%s\n' "$2"
}

case ${1:-} in
  image)
    [ $# -eq 1 ] || usage
    one_value "image" "$(sed -n 's/^ *image: *//p' "$manifest" | sort -u)"
    ;;
  cluster-cidr)
    [ $# -eq 1 ] || usage
    one_value "--cluster-cidr" "$(sed -n 's/^ *- --cluster-cidr=//p' "$manifest")"
    ;;
  with-iface)
    if [ $# -ne 2 ] || ! [[ $2 =~ ^[A-Za-z0-9._-]{1,15}$ ]]; then
      usage
    fi
    one_value "'- --backend=' argument" "$(grep -e '^ *- --backend=' "$manifest" || true)" >/dev/null
    sed "s|^\( *\)- --backend=.*$|&\n\1- --iface=$2|" "$manifest"
    ;;
  *)
    usage
    ;;
esac
