"""`netagent run`'s flags parsed once into the frozen `DaemonConfig` (netagent/daemon/config.py):
every flag's value as its enum, bool or checked value, and a bad value's error naming the flag."""
from __future__ import annotations

import dataclasses
import ipaddress

import pytest

from netagent.cli import build_parser
from netagent.daemon.config import NO_PROXY, ConfigError, DaemonConfig, parse_run_config
from netagent.errors import NetagentError
from netagent.kernel.iptables.backend import BackendChoice
from netagent.kernel.pod_attachment import PodAttachment
from netagent.noderoutes.host import ChecksumOffloadPolicy, Masquerade
from netagent.noderoutes.routing.model import Mode
from proxy.backend import ProxyMode

CLUSTER = ["--node-name", "node-1", "--cluster-cidr", "10.244.0.0/16"]


def config(*argv: str) -> DaemonConfig:
    return parse_run_config(build_parser().parse_args(["run", *CLUSTER, *argv]))


def cluster(*argv: str):
    parsed = config(*argv).cluster
    assert parsed is not None
    return parsed


def test_the_defaults():
    parsed = config()
    cni, c = parsed.cni, parsed.cluster
    assert c is not None
    assert (cni.socket, cni.workers, cni.conf_dir, cni.attachment, cni.portmap, cni.bin_dir, cni.network) == (
        "/run/netagent/cni.sock", 8, "/etc/cni/net.d", PodAttachment.BRIDGE, None, "/opt/cni/bin", "netagent")
    r = c.routing
    assert (r.node_name, r.cluster_cidrs, r.routing.mode, r.routing.auto_encap) == (
        "node-1", (ipaddress.ip_network("10.244.0.0/16"),), Mode.VXLAN, Mode.VXLAN)
    assert (r.routing.vxlan_vni, r.routing.vxlan_port, r.masquerade, r.checksum_offload) == (
        1, 4789, Masquerade.ON, ChecksumOffloadPolicy.AUTO)
    assert (r.lease_timeout, r.resync_interval, r.min_sync_interval) == (60.0, 30.0, 0.0)
    assert r.service_cidrs == (ipaddress.ip_network("10.96.0.0/12"),)
    assert c.iptables_backend is BackendChoice.AUTO and c.kubeconfig is None
    p = c.proxy
    assert (p.requested, p.nodeport_cidrs, p.sync_period, p.healthz_bind, p.ipvs_scheduler) == (
        None, (), 30.0, "0.0.0.0:10256", "rr")
    assert not p.ebpf.given and p.ebpf.pod_veths is False and p.limits.ports_per_service == 1000
    assert not p.limits.external_ips.deny_external_ips
    pol = c.policy
    assert (pol.enabled, pol.anti_spoofing, pol.add_wait, pol.sync_period, pol.attachment) == (
        False, True, 2.0, 30.0, PodAttachment.BRIDGE)
    assert pol.limits.rules == 500
    b = c.bgp
    assert (b.wanted, b.asn, b.mesh, b.bfd, b.config_map) == (False, 64512, True, False, "kube-system/netagent-bgp")
    assert (c.status.status_bind, c.status.metrics_binds) == ("0.0.0.0:10258", ("127.0.0.1:10249",))


def test_it_is_frozen():
    parsed = config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.cni = None   # type: ignore[misc]


def test_cni_only_has_no_cluster_and_needs_no_cluster_flags():
    parsed = parse_run_config(build_parser().parse_args(["run", "--cni-only", "--cni-socket", "/s", "--workers", "2"]))
    assert parsed.cluster is None and (parsed.cni.socket, parsed.cni.workers) == ("/s", 2)


@pytest.mark.parametrize("argv, expected", [
    (["--proxy-mode", "iptables"], ProxyMode.IPTABLES), (["--proxy-mode", "ipvs"], ProxyMode.IPVS),
    (["--proxy-mode", "ebpf"], ProxyMode.EBPF), (["--proxy-mode", "nftables"], ProxyMode.NFTABLES),
    (["--proxy-mode", "none"], NO_PROXY), ([], None)])
def test_the_proxy_mode_is_an_enum(argv, expected):
    assert cluster(*argv).proxy.requested is expected


@pytest.mark.parametrize("backend, auto_bgp, wanted", [
    ("bgp", "off", True), ("auto", "on", True), ("auto", "off", False), ("vxlan", "on", False),
    ("host-gw", "off", False), ("ipip", "off", False)])
def test_the_routing_mode_and_whether_bird_runs(backend, auto_bgp, wanted):
    c = cluster("--backend", backend, "--auto-bgp", auto_bgp)
    assert c.routing.routing.mode is Mode(backend) and c.bgp.wanted is wanted


def test_every_routing_flag():
    c = cluster("--backend", "auto", "--auto-encap", "ipip", "--vxlan-vni", "7", "--vxlan-port", "8472",
                "--vxlan-checksum-offload", "off", "--masquerade", "off", "--iface", "eth1", "--iface-regex", "^e",
                "--lease-timeout", "5", "--resync-period", "10", "--min-sync-period", "0.5",
                "--cluster-cidr", "fd00:10:244::/56", "--service-cidr", "10.96.0.0/16", "--iptables-backend", "nft",
                "--kubeconfig", "/k")
    r = c.routing
    assert (r.routing.auto_encap, r.routing.vxlan_vni, r.routing.vxlan_port) == (Mode.IPIP, 7, 8472)
    assert (r.checksum_offload, r.masquerade, r.iface, r.iface_regex) == (
        ChecksumOffloadPolicy.OFF, Masquerade.OFF, "eth1", "^e")
    assert (r.lease_timeout, r.resync_interval, r.min_sync_interval) == (5.0, 10.0, 0.5)
    assert [c.version for c in r.cluster_cidrs] == [4, 6]
    assert r.service_cidrs == (ipaddress.ip_network("10.96.0.0/16"),)
    assert c.iptables_backend is BackendChoice.NFT and c.kubeconfig == "/k"


def test_every_cni_flag():
    cni = config("--cni-socket", "/s", "--workers", "3", "--cni-conf-dir", "", "--cni-mode", "routed",
                 "--cni-portmap", "on", "--cni-bin-dir", "/b", "--cni-data-dir", "/d").cni
    assert (cni.socket, cni.workers, cni.conf_dir, cni.attachment, cni.portmap, cni.bin_dir, cni.data_dir) == (
        "/s", 3, "", PodAttachment.ROUTED, True, "/b", "/d")
    assert config("--cni-portmap", "off").cni.portmap is False


def test_every_proxy_flag():
    p = cluster("--nodeport-addresses", "10.0.0.0/8,192.168.0.0/16", "--sync-period", "5",
                "--healthz-bind-address", "127.0.0.1:1", "--ipvs-scheduler", "wrr", "--bpf-root", "/b",
                "--cgroup-root", "/c", "--bpf-nodeport-device", "auto", "--bpf-map-max", "na_svc=1024",
                "--bpf-pod-veths", "--proxy-max-ports-per-service", "9", "--deny-external-ips",
                "--service-cidr", "10.96.0.0/16").proxy
    assert p.nodeport_cidrs == ("10.0.0.0/8", "192.168.0.0/16")
    assert (p.sync_period, p.healthz_bind, p.ipvs_scheduler) == (5.0, "127.0.0.1:1", "wrr")
    assert (p.ebpf.bpf_root, p.ebpf.cgroup_root, p.ebpf.nodeport_device, p.ebpf.pod_veths) == ("/b", "/c", "auto", True)
    assert p.ebpf.given and p.ebpf.map_sizes["na_svc"] == 1024
    assert p.limits.ports_per_service == 9 and p.limits.external_ips.deny_external_ips
    assert p.limits.external_ips.service_cidrs == ("10.96.0.0/16",)


def test_every_policy_flag():
    pol = cluster("--network-policy", "--policy-add-wait", "0.5", "--policy-sync-period", "7",
                  "--pod-anti-spoofing", "off", "--policy-max-ip-blocks", "5", "--policy-max-pairs", "7",
                  "--cni-mode", "routed", "--min-sync-period", "2").policy
    assert (pol.enabled, pol.add_wait, pol.sync_period, pol.anti_spoofing, pol.attachment, pol.min_sync_period) == (
        True, 0.5, 7.0, False, PodAttachment.ROUTED, 2.0)
    assert (pol.limits.ip_blocks, pol.limits.pairs, pol.limits.rules) == (5, 7, 500)


def test_every_bgp_and_status_flag():
    c = cluster("--backend", "bgp", "--bgp-as", "65000", "--bgp-mesh", "off", "--bgp-bfd", "on",
                "--bgp-state-dir", "/st", "--bgp-config", "ns/cm", "--status-bind", "127.0.0.1:2",
                "--metrics-bind-address", "127.0.0.1:3", "--metrics-bind-address", "[::1]:3")
    b = c.bgp
    assert (b.asn, b.mesh, b.bfd, b.state_dir, b.config_map) == (65000, False, True, "/st", "ns/cm")
    assert (c.status.status_bind, c.status.metrics_binds) == ("127.0.0.1:2", ("127.0.0.1:3", "[::1]:3"))
    assert cluster("--metrics-bind-address", "").status.metrics_binds == ()


@pytest.mark.parametrize("argv, flag", [
    (["--cluster-cidr", "10.0.0.1/8"], "--cluster-cidr"),
    (["--cluster-cidr", "10.1.0.0/16"], "--cluster-cidr is given once per IP family"),
    (["--service-cidr", "nonsense"], "--service-cidr"),
    (["--vxlan-vni", "0"], "--vxlan-vni"),
    (["--vxlan-port", "70000"], "--vxlan-port"),
    (["--lease-timeout", "0"], "--lease-timeout"),
    (["--resync-period", "-1"], "--resync-period"),
    (["--min-sync-period", "-1"], "--min-sync-period"),
    (["--workers", "0"], "--workers"),
    (["--sync-period", "0"], "--sync-period"),
    (["--policy-sync-period", "0"], "--policy-sync-period"),
    (["--nodeport-addresses", "10.0.0.0/33"], "--nodeport-addresses"),
    (["--bpf-map-max", "na_svc=1"], "--bpf-map-max"),
    (["--bpf-map-max", "nonsense"], "--bpf-map-max"),
    (["--bgp-as", "0"], "--bgp-as"),
    (["--bgp-reflector-label", "example.com/rr"], "--bgp-reflector-label"),
    (["--bgp-config", "ns/"], "--bgp-config"),
    (["--status-bind", "nowhere"], "--status-bind"),
    (["--healthz-bind-address", "1.2.3.4"], "--healthz-bind-address"),
    (["--metrics-bind-address", "1.2.3.4:99999"], "--metrics-bind-address"),
])
def test_a_bad_value_is_an_error_naming_its_flag(argv, flag):
    with pytest.raises(ConfigError, match=flag) as caught:
        config(*argv)
    assert isinstance(caught.value, NetagentError)


@pytest.mark.parametrize("argv, message", [
    (["run", "--cluster-cidr", "10.244.0.0/16"], "no node name: pass --node-name"),
    (["run", "--node-name", "n"], "--cluster-cidr is required"),
])
def test_cluster_mode_needs_a_node_name_and_a_cluster_cidr(argv, message, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    args = build_parser().parse_args(argv)
    args.node_name = args.node_name if "--node-name" in argv else None
    with pytest.raises(ConfigError, match=message):
        parse_run_config(args)


def test_the_cli_reports_a_bad_value_once_naming_its_flag(capsys, monkeypatch):
    from netagent.cli import main
    from netagent.daemon import run

    def not_reached(config):
        raise AssertionError("run_agent must not start with a bad flag")
    monkeypatch.setattr(run, "run_agent", not_reached)
    assert main(["run", *CLUSTER, "--vxlan-port", "0"]) == 1
    assert capsys.readouterr().err.strip() == "netagent run: --vxlan-port: 0 is not a port"


def test_the_cli_hands_run_agent_the_parsed_config(monkeypatch):
    from netagent.cli import main
    from netagent.daemon import run
    handed: list = []
    monkeypatch.setattr(run, "run_agent", lambda config: handed.append(config) or 0)
    assert main(["run", *CLUSTER, "--proxy-mode", "ipvs", "--auto-bgp", "on", "--backend", "auto"]) == 0
    (parsed,) = handed
    assert isinstance(parsed, DaemonConfig) and parsed.cluster is not None
    assert parsed.cluster.proxy.requested is ProxyMode.IPVS and parsed.cluster.bgp.wanted is True
