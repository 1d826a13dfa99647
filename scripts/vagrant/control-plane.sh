#!/usr/bin/env bash
# Vagrant lab, step 3 of 3 on cp only: kubeadm init with the manifest's --cluster-cidr as the
# pod network and no kube-proxy (netagent replaces it), then netagent installed by its DaemonSet
# alone, as deploy/README.md, "Prepare the cluster, then apply" says: the netagent-apiserver
# ConfigMap (without kube-proxy the `kubernetes` Service address does not answer: the agent is
# pointed at the API server itself), and deploy/netagent.yaml applied with --iface=<the lab
# network's NIC> added by manifest.sh (the default route is Vagrant's NAT NIC, the same address
# on every node). The workers join with the same bootstrap token (worker.sh).
#
#     control-plane.sh CONTROL_PLANE_IP BOOTSTRAP_TOKEN     # NETAGENT_SRC=DIR (default /vagrant)
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 CONTROL_PLANE_IP BOOTSTRAP_TOKEN" >&2
  exit 2
fi
control_plane_ip=$1
token=$2
src=${NETAGENT_SRC:-/vagrant}
export KUBECONFIG=/etc/kubernetes/admin.conf

cluster_cidr=$("$src/scripts/vagrant/manifest.sh" cluster-cidr)

if [ ! -f /etc/kubernetes/admin.conf ]; then
  kubeadm init --apiserver-advertise-address="$control_plane_ip" \
    --pod-network-cidr="$cluster_cidr" --skip-phases=addon/kube-proxy \
    --token="$token" --token-ttl=0
fi
mkdir -p /home/vagrant/.kube
cp /etc/kubernetes/admin.conf /home/vagrant/.kube/config
chown -R vagrant:vagrant /home/vagrant/.kube

kubectl -n kube-system create configmap netagent-apiserver \
  --from-literal=KUBERNETES_SERVICE_HOST="$control_plane_ip" --from-literal=KUBERNETES_SERVICE_PORT=6443 \
  --dry-run=client -o yaml | kubectl apply -f -
iface=$(ip -o -4 addr show to "$control_plane_ip/24" | awk '{print $2; exit}')
if [ -z "$iface" ]; then
  echo "control-plane.sh: no interface holds an address in $control_plane_ip/24" >&2
  exit 1
fi
"$src/scripts/vagrant/manifest.sh" with-iface "$iface" | kubectl apply -f -
kubectl -n kube-system rollout status ds/netagent --timeout=300s
