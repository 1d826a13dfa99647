#!/usr/bin/env bash
# Vagrant lab, step 3 of 3 on worker1 and worker2: kubeadm join with the lab's bootstrap token
# (kept in .vagrant/kubeadm-token by the Vagrantfile; CA pinning skipped: acceptable on a
# host-only lab network only). The DaemonSet applied on cp then starts netagent here, from the
# image image.sh loaded.
#
#     worker.sh CONTROL_PLANE_IP BOOTSTRAP_TOKEN
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 CONTROL_PLANE_IP BOOTSTRAP_TOKEN" >&2
  exit 2
fi
control_plane_ip=$1
token=$2

if [ ! -f /etc/kubernetes/kubelet.conf ]; then
  kubeadm join "$control_plane_ip:6443" --token="$token" \
    --discovery-token-unsafe-skip-ca-verification
fi
