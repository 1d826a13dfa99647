#!/usr/bin/env bash
# Vagrant lab, step 1 of 3, on every node (cp, worker1, worker2): what kubeadm needs.
# Swap off, overlay and br_netfilter loaded, ip_forward on (kubeadm's preflight checks it, and
# the unprivileged agent container cannot write /proc/sys: deploy/README.md, "Privileges: three
# capabilities, not `privileged`"); Debian's containerd with systemd cgroups and the CNI
# directories the DaemonSet writes to; kubeadm, kubelet, kubectl and kubernetes-cni (containerd
# needs its `loopback`) from pkgs.k8s.io; the kubelet on the lab network's address (the first
# NIC is Vagrant's NAT, with the same address on every node). Nothing of netagent is installed
# on the host: the DaemonSet's init container installs the CNI shim (image.sh loads the image).
#
#     node.sh NODE_IP K8S_MINOR        # e.g. node.sh 192.168.56.11 v1.31
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 NODE_IP K8S_MINOR" >&2
  exit 2
fi
node_ip=$1
k8s_minor=$2
export DEBIAN_FRONTEND=noninteractive

swapoff -a
sed -i '/\sswap\s/s/^/#/' /etc/fstab
printf 'overlay\nbr_netfilter\n' > /etc/modules-load.d/k8s.conf
modprobe overlay
modprobe br_netfilter
printf 'net.ipv4.ip_forward = 1\nnet.bridge.bridge-nf-call-iptables = 1\n' > /etc/sysctl.d/k8s.conf
sysctl --system >/dev/null

apt-get update -qq
apt-get install -y -qq curl gpg ca-certificates containerd
mkdir -p /etc/containerd
containerd config default > /etc/containerd/config.toml
sed -i -e 's/SystemdCgroup = false/SystemdCgroup = true/' \
       -e 's|bin_dir = .*|bin_dir = "/opt/cni/bin"|' \
       -e 's|conf_dir = .*|conf_dir = "/etc/cni/net.d"|' /etc/containerd/config.toml
systemctl restart containerd

mkdir -p /etc/apt/keyrings
curl -fsSL "https://pkgs.k8s.io/core:/stable:/$k8s_minor/deb/Release.key" \
  | gpg --dearmor --yes -o /etc/apt/keyrings/kubernetes.gpg
echo "deb [signed-by=/etc/apt/keyrings/kubernetes.gpg] https://pkgs.k8s.io/core:/stable:/$k8s_minor/deb/ /" \
  > /etc/apt/sources.list.d/kubernetes.list
apt-get update -qq
apt-get install -y -qq kubelet kubeadm kubectl kubernetes-cni
apt-mark hold kubelet kubeadm kubectl
echo "KUBELET_EXTRA_ARGS=--node-ip=$node_ip" > /etc/default/kubelet
