#!/usr/bin/env bash
# Vagrant lab, step 2 of 3, on every node: the netagent image, built from this checkout
# (synced at /vagrant) with scripts/build-image and loaded into containerd's Kubernetes
# namespace, as deploy/README.md says ("Build the image", then "Load it on the nodes"): no
# registry. build-image makes the Debian 12 base with mmdebstrap from Debian's mirror when it
# is missing, builds on the host network (podman adds no bridge or firewall rules to the node)
# and, with --if-stale, only when the checkout changed: after a code change,
# `vagrant provision --provision-with image` rebuilds and reloads it on every node (then
# `kubectl -n kube-system rollout restart ds/netagent` on cp).
# The tag is the one deploy/netagent.yaml names (imagePullPolicy IfNotPresent).
#
#     image.sh                 # NETAGENT_SRC=DIR: the checkout (default /vagrant)
set -euo pipefail
src=${NETAGENT_SRC:-/vagrant}
export DEBIAN_FRONTEND=noninteractive

image=$("$src/scripts/vagrant/manifest.sh" image)

apt-get update -qq
apt-get install -y -qq --no-install-recommends podman mmdebstrap
"$src/scripts/build-image" --if-stale --tag "$image" >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
podman save --format docker-archive -o "$work/netagent.tar" "$image"
ctr -n k8s.io images import "$work/netagent.tar"
