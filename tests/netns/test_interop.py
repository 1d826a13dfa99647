"""Interoperability with the reference CNI plugins (Debian's containernetworking-plugins).

netagent claims to be a drop-in member of the CNI ecosystem in both directions:
- its IPAM (`netagent-ipam`) serves other main plugins the way host-local does, in
  host-local's on-disk layout;
- its main plugin (`netagent`) delegates IPAM to host-local like any reference plugin;
- its results are complete enough for the chained meta plugins that read `prevResult`
  (portmap needs the container's IPs; bandwidth needs the host veth, listed without a
  `sandbox`, and the pod interface in the container);
- it is a well-behaved later link of a chain: after `loopback` it passes the previous
  result on and indexes its own IPs past the interfaces already listed.

Each test runs the real binaries from /usr/lib/cni and ours, exactly as a runtime would
(`cni.invoke.run_conflist`, from inside a node namespace), then proves the outcome with
real packets, the kernel's state and the reservation files, and that DEL undoes it all.
Everything lives in namespaces the test creates; the root namespace is never touched.
The last test holds `netagent-ipam` to ignoring another main plugin's own keys.
"""
import ipaddress
import json
import os
import subprocess
import sys

import pytest

from cni import invoke
from netagent.kernel import namespaces
from netagent.kernel.pod_attachment import PodAttachment

REFERENCE_DIR = "/usr/lib/cni"
LINE_BREAK = "\r\n"


def require_reference(*plugins):
    missing = [p for p in plugins if not os.access(os.path.join(REFERENCE_DIR, p), os.X_OK)]
    if missing:
        pytest.skip(f"reference CNI plugin(s) {', '.join(missing)} not found in {REFERENCE_DIR} "
                    "(Debian package containernetworking-plugins)")


def links(netns_name: str) -> dict:
    out = namespaces.run_in(netns_name, ["ip", "-j", "-d", "link", "show"], check=True).stdout
    return {link["ifname"]: link for link in json.loads(out)}


def ping(netns_name: str, address: str) -> bool:
    """A reply within 10 s (done at the first one; see LabNode.ping)."""
    return namespaces.run_in(netns_name, ["ping", "-c", "1", "-w", "10", "-i", "0.2", address]).returncode == 0


def reservation_files(directory: str) -> dict:
    """host-local layout: {ip: file content}, without the lock and last_reserved_ip files."""
    if not os.path.isdir(directory):
        return {}
    out = {}
    for name in os.listdir(directory):
        if name == "lock" or name.startswith("last_reserved_ip."):
            continue
        with open(os.path.join(directory, name), newline="") as f:
            out[name] = f.read()
    return out


def address_of(result: dict) -> str:
    return result["ips"][0]["address"].split("/")[0]


def host_interfaces(result: dict) -> list:
    return [i["name"] for i in result["interfaces"] if not i.get("sandbox")]


class Chain:
    """A conflist run by the runtime's rules from inside the node namespace."""

    def __init__(self, node, conflist: dict, runtime_config: dict | None = None):
        self.node = node
        self.conflist = conflist
        self.runtime_config = runtime_config

    def run(self, command: str, *, container_id: str, netns_name: str, prev_result=None,
            runtime_config=None):
        result = invoke.run_conflist(
            self.conflist, command=command, bin_dirs=[self.node.bin_dir, REFERENCE_DIR],
            container_id=container_id, netns=namespaces.netns_path(netns_name), ifname="eth0",
            prev_result=prev_result, runtime_config=runtime_config or self.runtime_config,
            prefix=tuple(namespaces.exec_prefix(self.node.node)))
        if command == "DEL":
            self.node.settle()  # the agent acknowledges DEL before the kernel teardown ends
        return result


# --------------------------------------------------------------------- reference bridge + our IPAM

REF_RANGES = {"ipv4": ["10.250.1.0/24"], "ipv6": ["fd00:250:1::/64"], "dual": ["10.250.1.0/24", "fd00:250:1::/64"]}


def ips_by_family(result: dict) -> dict:
    """{4 or 6: (address, prefix, gateway)} of a result's IPs."""
    out = {}
    for ip in result["ips"]:
        itf = ipaddress.ip_interface(ip["address"])
        out[itf.version] = (str(itf.ip), itf.network.prefixlen, ip.get("gateway"))
    return out


@pytest.mark.parametrize("cni_version, family", [("0.4.0", "ipv4"), ("1.0.0", "ipv4"), ("1.0.0", "ipv6"),
                                                 ("1.0.0", "dual")])
def test_reference_bridge_with_netagent_ipam(make_node, cni_version, family):
    """The reference bridge plugin allocates through `netagent-ipam` as through host-local,
    one address per range set: IPv4, IPv6 or both."""
    require_reference("bridge")
    node = make_node(with_agent=False)
    data_dir = os.path.join(node.workdir, "ref-ipam")
    subnets = [ipaddress.ip_network(s) for s in REF_RANGES[family]]
    conflist = {"cniVersion": cni_version, "name": "refnet", "plugins": [{
        "type": "bridge", "bridge": "cni-ref0", "isGateway": True,
        "ipam": {"type": "netagent-ipam", "ranges": [[{"subnet": str(s)}] for s in subnets],
                 "dataDir": data_dir}}]}
    chain = Chain(node, conflist)
    network_dir = os.path.join(data_dir, "refnet")

    pods = {}
    for name in ("a", "b"):
        netns_name = node.new_pod_netns(name)
        container_id = f"{node.prefix}-{name}"
        result = chain.run("ADD", container_id=container_id, netns_name=netns_name)
        pods[name] = (netns_name, container_id, result)

    a_ns, a_id, a_result = pods["a"]
    b_ns, b_id, b_result = pods["b"]
    for _, _, result in pods.values():
        assert result["cniVersion"] == cni_version
        assert {v: (prefix, gw) for v, (_, prefix, gw) in ips_by_family(result).items()} == \
            {s.version: (s.prefixlen, str(s[1])) for s in subnets}
        assert ("version" in result["ips"][0]) == (cni_version == "0.4.0")
    files = {}
    for subnet in subnets:
        a_ip, b_ip = (ips_by_family(r)[subnet.version][0] for r in (a_result, b_result))
        assert a_ip != b_ip and str(subnet[1]) not in (a_ip, b_ip)
        files.update({a_ip: f"{a_id}{LINE_BREAK}eth0", b_ip: f"{b_id}{LINE_BREAK}eth0"})
        # the bridge plugin put the gateway our IPAM returned on its bridge
        bridge_addrs = namespaces.run_in(node.node, ["ip", "-o", f"-{subnet.version}", "addr", "show", "dev",
                                                     "cni-ref0"], check=True).stdout
        assert f"{subnet[1]}/{subnet.prefixlen}" in bridge_addrs
        assert ping(a_ns, b_ip) and ping(b_ns, a_ip) and ping(a_ns, str(subnet[1]))
    assert reservation_files(network_dir) == files
    assert "lock" in os.listdir(network_dir)
    # bridge's CHECK asks our IPAM for the reservation, then compares the kernel with the result
    chain.run("CHECK", container_id=a_id, netns_name=a_ns, prev_result=a_result)

    host_veths = {name: host_interfaces(result) for name, (_, _, result) in pods.items()}
    for netns_name, container_id, result in pods.values():
        chain.run("DEL", container_id=container_id, netns_name=netns_name, prev_result=result)
    assert reservation_files(network_dir) == {}
    remaining = links(node.node)
    for names in host_veths.values():
        assert [n for n in names if n != "cni-ref0" and n in remaining] == []
    for netns_name, _, _ in pods.values():
        assert "eth0" not in links(netns_name)


# --------------------------------------------------------------------- our plugin + reference host-local

@pytest.mark.parametrize("with_agent, mode, family", [
    (True, "bridge", "ipv4"), (False, "bridge", "ipv4"), (False, "bridge", "dual"), (True, "routed", "dual")],
    ids=["agent", "in-process", "in-process-dual", "agent-routed-dual"])
def test_netagent_with_reference_host_local(make_node, with_agent, mode, family):
    """Our plugin delegates IPAM to host-local: host-local's files appear and go away; with a
    range set per family, one address of each, and our wiring of both."""
    require_reference("host-local")
    node = make_node(with_agent=with_agent, mode=PodAttachment(mode))
    data_dir = os.path.join(node.workdir, "host-local")
    subnets = [ipaddress.ip_network(s) for s in {"ipv4": ["10.250.2.0/24"],
                                                  "dual": ["10.250.2.0/24", "fd00:250:2::/64"]}[family]]
    node.conflist["plugins"][0]["ipam"] = {
        "type": "host-local", "ranges": [[{"subnet": str(s)}] for s in subnets], "dataDir": data_dir}
    network_dir = os.path.join(data_dir, "netagent")
    routed = mode == "routed"

    a, b = node.add_pod("a"), node.add_pod("b")
    files = {}
    for pod in (a, b):
        found = ips_by_family(pod.result)
        assert sorted(found) == [s.version for s in subnets]
        for subnet in subnets:
            address, prefix, gateway = found[subnet.version]
            assert ipaddress.ip_address(address) in subnet
            assert prefix == (subnet.max_prefixlen if routed else subnet.prefixlen)
            if not routed:
                assert gateway == str(subnet[1])
            files[address] = f"{pod.container_id}{LINE_BREAK}eth0"
        assert pod.result["interfaces"][-1]["sandbox"] == pod.netns
    assert reservation_files(network_dir) == files
    for subnet in subnets:
        a_ip, b_ip = (ips_by_family(p.result)[subnet.version][0] for p in (a, b))
        assert node.ping("a", b_ip) and node.ping("b", a_ip)
        if not routed:
            assert node.ping("a", str(subnet[1]))

    # CHECK delegates too: host-local confirms its reservation
    conf = node.plugin_config(prev_result=a.result)
    assert node.cni("CHECK", container_id=a.container_id, netns=a.netns, config=conf) == (0, None)

    hosts = [p.result["interfaces"][1]["name"] for p in (a, b)]  # na0, host veth, eth0
    node.delete_pod("a")
    node.delete_pod("b")
    node.settle()
    assert reservation_files(network_dir) == {}
    remaining = links(node.node)
    assert [h for h in hosts if h in remaining] == []


# --------------------------------------------------------------------- chained meta plugins

SERVER = r"""
import socket, sys
s = socket.socket(socket.AF_INET6)  # both families: IPv4 peers come as ::ffff:a.b.c.d
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", 8080))
s.listen(2)
s.settimeout(120)
print("listening", flush=True)
for _ in range(int(sys.argv[1])):
    conn, peer = s.accept()
    conn.sendall(("hello from pod a; you are " + peer[0].removeprefix("::ffff:")).encode())
    conn.close()
"""

CLIENT = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
c.settimeout(30)
data = b""
while True:
    chunk = c.recv(4096)
    if not chunk:
        break
    data += chunk
print(data.decode())
"""


def nat_rules(node) -> str:
    return namespaces.run_in(node.node, ["iptables", "-t", "nat", "-S"], check=True).stdout


@pytest.mark.parametrize("family", ["ipv4", "dual"])
def test_chain_with_portmap_and_bandwidth(make_node, family):
    """portmap and bandwidth chained after our plugin read our prevResult and work.

    portmap (`snat: true`) runs `iptables` inside the node namespace (Debian's default
    backend, iptables-nft; the node namespace has its own tables). It installs
    CNI-HOSTPORT-DNAT (from PREROUTING and OUTPUT, for local destination addresses, so the
    bridge's gateway address qualifies), a per-container CNI-DN-<hash> chain with the DNAT,
    and, because of `snat`, mark rules (CNI-HOSTPORT-SETMARK for sources in the container's
    subnet and 127.0.0.1) plus CNI-HOSTPORT-MASQ in POSTROUTING. The masquerade is what makes
    the pod-to-pod case work: pod b's SYN to the gateway is DNATed to pod a, which sits on the
    same bridge, so without SNAT pod a would answer pod b directly at layer 2 with its own
    address and pod b would reset the connection; with it the server sees the gateway as the
    peer. (This kernel has br_netfilter built in with bridge-nf-call-iptables=1 in every
    namespace, so conntrack would also un-DNAT the bridged reply; the SNAT makes the test
    independent of that.) For IPv4 `snat` also sets `route_localnet=1` on the interface that
    routes to the container (our bridge na0), in the node namespace, so that 127.0.0.1 host
    ports work; the test checks it is set there. No `hairpinMode` is needed: the connection
    comes from another pod, not from pod a itself.

    bandwidth finds the host veth as the veth peer of the pod's eth0 and requires it in
    our result's interfaces without `sandbox`; it puts a tbf on it (ingress limit) and an
    ifb device with a tbf behind an ingress-redirect (egress limit), and it appends the ifb
    device to the result's interfaces.

    portmap's CHECK is not run: see the comment at the CHECK below.

    Dual-stack: our result lists the pod's IPv6 address too, so portmap maps the host port in
    ip6tables as well (its DNAT to `[address]:8080`, its masquerade), and pod b reaches pod a's
    server through the bridge's IPv6 gateway address as through its IPv4 one.
    """
    require_reference("portmap", "bandwidth")
    dual = family == "dual"
    node = make_node(subnets=("10.250.3.0/24", "fd00:250:3::/64") if dual else ("10.250.3.0/24",))
    conflist = json.loads(json.dumps(node.conflist))
    conflist["plugins"] += [{"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
                            {"type": "bandwidth", "capabilities": {"bandwidth": True}}]
    runtime_config = {
        "portMappings": [{"hostPort": 18080, "containerPort": 8080, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 8000000, "ingressBurst": 16000000,
                      "egressRate": 8000000, "egressBurst": 16000000}}
    chain = Chain(node, conflist, runtime_config)

    a_ns = node.new_pod_netns("a")
    a_id = f"{node.prefix}-a"
    result = chain.run("ADD", container_id=a_id, netns_name=a_ns)
    assert result["cniVersion"] == "1.0.0"
    names = [i["name"] for i in result["interfaces"]]
    node_links = links(node.node)
    host = [n for n in host_interfaces(result)
            if node_links[n].get("linkinfo", {}).get("info_kind") == "veth"]
    assert names[:3] == ["na0", host[0], "eth0"] and len(host) == 1
    assert result["interfaces"][2]["sandbox"] == namespaces.netns_path(a_ns)
    a_ip = address_of(result)
    assert a_ip.startswith("10.250.3.") and result["ips"][0]["interface"] == 2
    assert result["ips"][0]["gateway"] == "10.250.3.1"
    reservations_dir = os.path.join(node.data_dir, "netagent")
    a_ips = [ip["address"].split("/")[0] for ip in result["ips"]]
    assert sorted(reservation_files(reservations_dir)) == sorted(a_ips)
    if dual:
        a_v6 = a_ips[1]
        assert a_v6.startswith("fd00:250:3::") and result["ips"][1]["interface"] == 2
        rules6 = namespaces.run_in(node.node, ["ip6tables", "-t", "nat", "-S"], check=True).stdout
        assert f"--to-destination [{a_v6}]:8080" in rules6
        assert "-s fd00:250:3::/64 -p tcp -m tcp --dport 18080 -j CNI-HOSTPORT-SETMARK" in rules6

    # portmap: its chains in the node namespace's nat table, DNAT to pod a
    rules = nat_rules(node)
    assert "-N CNI-HOSTPORT-DNAT" in rules and "-N CNI-HOSTPORT-MASQ" in rules
    assert "-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT" in rules
    assert f"--to-destination {a_ip}:8080" in rules
    assert "-s 10.250.3.0/24 -p tcp -m tcp --dport 18080 -j CNI-HOSTPORT-SETMARK" in rules
    localnet = namespaces.run_in(node.node, ["cat", "/proc/sys/net/ipv4/conf/na0/route_localnet"])
    assert localnet.stdout.strip() == "1"
    # bandwidth: tbf on the host veth, and an ifb device carrying the egress limit
    qdiscs = json.loads(namespaces.run_in(node.node, ["tc", "-j", "qdisc", "show"], check=True).stdout)
    kinds = {(q.get("dev"), q.get("kind")) for q in qdiscs}
    assert (host[0], "tbf") in kinds and (host[0], "ingress") in kinds
    ifbs = [name for name, link in links(node.node).items()
            if link.get("linkinfo", {}).get("info_kind") == "ifb"]
    assert len(ifbs) == 1 and (ifbs[0], "tbf") in kinds
    for q in qdiscs:
        if q.get("kind") == "tbf":  # rates in bytes/s, bursts in bytes: 8 Mbit/s, 16 Mbit
            assert (q["options"]["rate"], q["options"]["burst"]) == (1_000_000, 2_000_000)
    redirect = namespaces.run_in(node.node, ["tc", "filter", "show", "dev", host[0], "ingress"],
                                 check=True).stdout
    assert f"Redirect to device {ifbs[0]}" in redirect
    assert names[3:] == ifbs  # bandwidth appends its ifb device to the result

    # CHECK with the ADD result, by our plugin and bandwidth. Not by portmap: its CHECK (in
    # the Debian 1.1.1 build) looks for the IPv4 DNAT rules in ip6tables too, and fails
    # ("could not check ipv6 dnat"; upstream issue containernetworking/plugins#819), for an
    # IPv4-only pod and for a dual-stack one alike, whichever main plugin came before it.
    without_portmap = dict(conflist, plugins=[p for p in conflist["plugins"] if p["type"] != "portmap"])
    Chain(node, without_portmap, runtime_config).run("CHECK", container_id=a_id, netns_name=a_ns,
                                                     prev_result=result)

    # pod b (plain, our plugin alone) reaches pod a's server through the host port
    b = node.add_pod("b")
    gateways = ["10.250.3.1", "fd00:250:3::1"] if dual else ["10.250.3.1"]
    server = subprocess.Popen([*namespaces.exec_prefix(a_ns), sys.executable, "-c", SERVER, str(len(gateways))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "listening", server.stderr.read()
        for gateway in gateways:
            client = node.exec_in("b", [sys.executable, "-c", CLIENT, gateway, "18080"], timeout=90)
            assert client.returncode == 0, client.stderr
            # the masquerade of portmap's snat: pod a sees the node's gateway, not pod b
            assert client.stdout.strip() == f"hello from pod a; you are {gateway}"
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
        server.stdout.close()
        server.stderr.close()

    # DEL in reverse order with the cached ADD result
    chain.run("DEL", container_id=a_id, netns_name=a_ns, prev_result=result)
    rules = nat_rules(node)
    assert a_ip not in rules and "CNI-DN-" not in rules and a_id not in rules
    if dual:
        rules6 = namespaces.run_in(node.node, ["ip6tables", "-t", "nat", "-S"], check=True).stdout
        assert a_v6 not in rules6 and "CNI-DN-" not in rules6
    assert "-N CNI-HOSTPORT-DNAT" in rules  # the shared chains stay, as portmap intends
    remaining = links(node.node)
    assert host[0] not in remaining and ifbs[0] not in remaining
    assert "eth0" not in links(a_ns)
    assert sorted(reservation_files(reservations_dir)) == sorted(ip["address"].split("/")[0]
                                                                  for ip in b.result["ips"])


# --------------------------------------------------------------------- reference loopback first

def test_reference_loopback_and_netagent_in_one_conflist(make_node):
    """loopback's result becomes our prevResult: we append ours and re-index our IPs."""
    require_reference("loopback")
    node = make_node(subnets=("10.250.4.0/24",), with_agent=False)
    conflist = json.loads(json.dumps(node.conflist))
    conflist["plugins"].insert(0, {"type": "loopback"})
    chain = Chain(node, conflist)
    netns_name = node.new_pod_netns("a")
    container_id = f"{node.prefix}-a"
    namespaces.run_in(netns_name, ["ip", "link", "set", "lo", "down"], check=True)

    result = chain.run("ADD", container_id=container_id, netns_name=netns_name)
    names = [i["name"] for i in result["interfaces"]]
    assert names[0] == "lo" and names[1] == "na0" and names[3] == "eth0"
    by_address = {ip["address"]: ip for ip in result["ips"]}
    assert by_address["127.0.0.1/8"]["interface"] == 0  # loopback's own, passed on untouched
    ours = [ip for ip in result["ips"] if ip["address"].startswith("10.250.4.")]
    assert len(ours) == 1 and ours[0]["interface"] == 3 and ours[0]["gateway"] == "10.250.4.1"
    assert ping(netns_name, "127.0.0.1") and ping(netns_name, "10.250.4.1")
    chain.run("CHECK", container_id=container_id, netns_name=netns_name, prev_result=result)

    host = result["interfaces"][2]["name"]
    chain.run("DEL", container_id=container_id, netns_name=netns_name, prev_result=result)
    assert host not in links(node.node) and "eth0" not in links(netns_name)
    assert reservation_files(os.path.join(node.data_dir, "netagent")) == {}


# --------------------------------------------------------------------- another main plugin's own keys

def test_reference_macvlan_vepa_with_netagent_ipam(make_node):
    """Another main plugin's keys are its own business: our IPAM must ignore them.

    macvlan's `"mode": "vepa"` shares a key name with our plugin's `mode`; `netagent-ipam`
    parses with `ConfigScope.IPAM`, so only IPAM's keys are judged.
    """
    require_reference("macvlan")
    node = make_node(with_agent=False)
    namespaces.run_in(node.node, ["ip", "link", "add", "up0", "type", "veth", "peer", "name", "up1"],
                      check=True)
    namespaces.run_in(node.node, ["ip", "link", "set", "up0", "up"], check=True)
    data_dir = os.path.join(node.workdir, "ref-ipam")
    conflist = {"cniVersion": "1.0.0", "name": "mvnet", "plugins": [{
        "type": "macvlan", "master": "up0", "mode": "vepa",
        "ipam": {"type": "netagent-ipam", "ranges": [[{"subnet": "10.250.5.0/24"}]],
                 "dataDir": data_dir}}]}
    chain = Chain(node, conflist)
    netns_name = node.new_pod_netns("a")
    container_id = f"{node.prefix}-a"
    result = chain.run("ADD", container_id=container_id, netns_name=netns_name)
    ip = address_of(result)
    assert ip.startswith("10.250.5.")
    network_dir = os.path.join(data_dir, "mvnet")
    assert reservation_files(network_dir) == {ip: f"{container_id}{LINE_BREAK}eth0"}
    chain.run("DEL", container_id=container_id, netns_name=netns_name, prev_result=result)
    assert reservation_files(network_dir) == {}
