#!/usr/bin/env bash
# Install everything netagent needs on a fresh Debian 12 or Ubuntu machine, as root:
# system packages (the kernel tools, the reference CNI plugins and containerd that the
# tests compare against, bcc and kernel headers for it, qemu with Debian's kernel for the VM tier: IPIP,
# IPVS, and podman, buildah and mmdebstrap for scripts/build-image), a virtual environment at .venv,
# and the static CNI shim (musl-tools' musl-gcc) in build/cni-shim/netagent; clang and
# libclang-rt-dev (libFuzzer, ASan, UBSan) build the shim's fuzzer, cni/shim/fuzz/. The venv is made from
# Debian's /usr/bin/python3 with --system-site-packages because bcc exists only as the
# Debian package python3-bpfcc. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: run as root (it installs system packages)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  python3 python3-venv python3-pip python3-bpfcc \
  iproute2 iputils-ping iptables ipset conntrack tcpdump util-linux procps \
  containernetworking-plugins containerd runc busybox-static iperf3 ethtool \
  qemu-system-x86 linux-image-amd64 cpio musl-tools linux-headers-amd64 clang libclang-rt-dev \
  podman buildah mmdebstrap shellcheck vagrant nftables python3-nftables bird2 curl unzip prometheus \
  chromium >/dev/null
# chromium: the headless browser tests/cluster/test_status_page.py loads the agent's /status page in.
# bird2's package enables a host-wide BIRD where systemd runs; netagent runs its own per node
# (--backend bgp) and the tests run theirs in namespaces, so the host's is stopped. Likewise
# prometheus (promtool and the binary for tests/unit/deploy/test_monitoring_rules.py and
# tests/cluster/test_monitoring.py, which runs its own in a lab node's namespace): without
# systemd its postinst starts it through its init script, unless policy-rc.d forbids it.
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl disable --now bird.service >/dev/null 2>&1 || true
  systemctl disable --now prometheus.service >/dev/null 2>&1 || true
elif [ -x /etc/init.d/prometheus ]; then
  /etc/init.d/prometheus stop >/dev/null 2>&1 || true
  update-rc.d prometheus disable >/dev/null 2>&1 || true
fi

# bcc compiles the eBPF programs at agent start and wants this kernel's headers in
# /lib/modules/$(uname -r)/{build,source}. When the running kernel has no Debian headers
# package (a custom kernel), point them at Debian's: the networking programs need only the
# UAPI headers, so the version skew is harmless (../shared/ENVIRONMENT.md, "bcc").
modules="/lib/modules/$(uname -r)"
if [ ! -e "$modules/build/include" ]; then
  headers=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1)
  if [ -n "$headers" ]; then
    mkdir -p "$modules"
    ln -sfn "$headers" "$modules/build"
    ln -sfn "${headers%-amd64}-common" "$modules/source"
  fi
fi

# scripts/build-kubernetes (the real-Kubernetes lab and test tier) needs Go at least as new as
# k8s/go.mod's `go` line; where the machine has none or an older one (Debian 12's golang is
# 1.19), the Go toolchain is fetched from the Go module proxy (golang.org/toolchain) into
# /usr/local/go-<version>, linked as /usr/local/bin/go.
want_go=$(awk '$1 == "go" { print $2; exit }' k8s/go.mod)
have_go=$(PATH=/usr/local/go/bin:$PATH go env GOVERSION 2>/dev/null | sed 's/^go//') || have_go=""
if [ -z "$have_go" ] || [ "$(printf '%s\n%s\n' "$want_go" "$have_go" | sort -V | head -1)" != "$want_go" ]; then
  toolchain=$(curl -fsS "${GOPROXY_URL:-https://proxy.golang.org}/golang.org/toolchain/@v/list" \
    | sed -n "s/^\(v0.0.1-go${want_go%.*}\.[0-9]*\)\.linux-amd64$/\1/p" | sort -V | tail -1)
  [ -n "$toolchain" ] || { echo "setup.sh: no Go ${want_go%.*} toolchain on the module proxy" >&2; exit 1; }
  tmp=$(mktemp -d)
  curl -fsS -o "$tmp/go.zip" "${GOPROXY_URL:-https://proxy.golang.org}/golang.org/toolchain/@v/$toolchain.linux-amd64.zip"
  (cd "$tmp" && unzip -q go.zip)
  rm -rf "/usr/local/go-${toolchain#v0.0.1-go}"
  mv "$tmp/golang.org/toolchain@$toolchain.linux-amd64" "/usr/local/go-${toolchain#v0.0.1-go}"
  chmod +x "/usr/local/go-${toolchain#v0.0.1-go}"/bin/* "/usr/local/go-${toolchain#v0.0.1-go}"/pkg/tool/*/*
  ln -sfn "/usr/local/go-${toolchain#v0.0.1-go}/bin/go" /usr/local/bin/go
  rm -rf "$tmp"
fi

if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -e '.[lab,test]'
cni/shim/build.sh build/cni-shim/netagent  # what `netagent cni install` copies to <bin dir>/netagent
echo "setup.sh: ready: .venv/bin/netagent"
