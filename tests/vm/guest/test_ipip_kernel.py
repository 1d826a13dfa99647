"""IPIP at the kernel level, inside the VM tier's guest (Debian's 6.1 kernel, ipip.ko).

These tests pin down what the IPIP routing backend relies on, before any netagent code is
involved: the module loads, an ipip link can be made, and a packet between two inner (pod)
addresses crosses an underlay veth as IP protocol 4 with the inner header intact. Both tunnel
shapes are covered:

* POINT_TO_POINT: one device per peer, `ip link add NAME type ipip local A remote B`, and a
  plain device route;
* NBMA: one device with only `local`, and per-peer routes `via <peer underlay> dev NAME onlink`;
  the kernel takes the outer destination from the route's gateway. This is the shape a node
  agent uses (one device, one route per remote node).

Topology (two namespaces, one veth as the underlay wire):

    ns A                                   ns B
    na-ul-a 192.0.2.1/24  <---- veth ---->  na-ul-b 192.0.2.2/24
    na-ipip 10.244.1.1/32                   na-ipip 10.244.2.1/32
    10.244.2.0/24 -> tunnel                 10.244.1.0/24 -> tunnel

tcpdump on B's underlay end captures only `ip proto 4`; the test parses the pcap itself and
asserts both directions carry the inner addresses.
"""
from __future__ import annotations

import enum
import ipaddress
import json
import select
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

from netagent.kernel import namespaces

UNDERLAY = {"a": "192.0.2.1", "b": "192.0.2.2"}
INNER = {"a": "10.244.1.1", "b": "10.244.2.1"}
INNER_NET = {"a": "10.244.1.0/24", "b": "10.244.2.0/24"}
UNDERLAY_IF = {"a": "na-ul-a", "b": "na-ul-b"}
TUNNEL_IF = "na-ipip"
IPPROTO_ICMP = 1
IPPROTO_IPIP = 4
PINGS = 2


class TunnelShape(enum.Enum):
    POINT_TO_POINT = "point-to-point"
    NBMA = "nbma"


def ip_batch(ns: str, commands: list[str]) -> None:
    proc = subprocess.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(commands) + "\n",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"ip -n {ns} -batch failed: {proc.stderr.strip()}\n{commands}"


def tunnel_commands(side: str, *, shape: TunnelShape) -> list[str]:
    peer = "b" if side == "a" else "a"
    if shape is TunnelShape.POINT_TO_POINT:
        link = f"link add name {TUNNEL_IF} type ipip local {UNDERLAY[side]} remote {UNDERLAY[peer]}"
        route = f"route add {INNER_NET[peer]} dev {TUNNEL_IF} src {INNER[side]}"
    else:
        link = f"link add name {TUNNEL_IF} type ipip local {UNDERLAY[side]}"
        route = (f"route add {INNER_NET[peer]} via {UNDERLAY[peer]} dev {TUNNEL_IF} onlink "
                 f"src {INNER[side]}")
    return [link, f"link set {TUNNEL_IF} up", f"address add {INNER[side]}/32 dev {TUNNEL_IF}", route]


def build_underlay(ns: dict[str, str]) -> None:
    ip_batch(ns["a"], [f"link add {UNDERLAY_IF['a']} type veth peer name {UNDERLAY_IF['b']} "
                       f"netns {ns['b']}",
                       f"address add {UNDERLAY['a']}/24 dev {UNDERLAY_IF['a']}",
                       f"link set {UNDERLAY_IF['a']} up"])
    ip_batch(ns["b"], [f"address add {UNDERLAY['b']}/24 dev {UNDERLAY_IF['b']}",
                       f"link set {UNDERLAY_IF['b']} up"])


def start_capture(ns: str, *, ifname: str, pcap: Path, count: int) -> subprocess.Popen:
    """tcpdump writing `count` IPIP packets to `pcap`; returns once it is listening."""
    proc = subprocess.Popen(
        namespaces.exec_prefix(ns) + ["tcpdump", "-i", ifname, "-n", "-U", "-Z", "root",
                                      "-c", str(count), "-w", str(pcap), "ip proto 4"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    said = b""
    deadline = time.monotonic() + 30
    while b"listening on" not in said:
        ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
        chunk = proc.stderr.read1(4096) if ready else b""
        if not chunk:
            proc.kill()
            proc.wait()
            raise AssertionError(f"tcpdump did not start: {said.decode(errors='replace')}")
        said += chunk
    return proc


def read_pcap_ipv4(pcap: Path) -> list[bytes]:
    """The IPv4 packets (Ethernet payloads) of a classic pcap file."""
    data = pcap.read_bytes()
    magic, = struct.unpack_from("<I", data, 0)
    assert magic in (0xA1B2C3D4, 0xA1B23C4D), f"not a little-endian pcap: {magic:#x}"
    linktype, = struct.unpack_from("<I", data, 20)
    assert linktype == 1, f"expected Ethernet captures, got link type {linktype}"
    packets, offset = [], 24
    while offset + 16 <= len(data):
        caplen, = struct.unpack_from("<I", data, offset + 8)
        frame = data[offset + 16:offset + 16 + caplen]
        offset += 16 + caplen
        if struct.unpack_from("!H", frame, 12)[0] == 0x0800:
            packets.append(frame[14:])
    return packets


def ipv4_header(packet: bytes) -> tuple[int, str, str, bytes]:
    """(protocol, source, destination, payload) of an IPv4 packet."""
    header_len = (packet[0] & 0x0F) * 4
    assert packet[0] >> 4 == 4, "not IPv4"
    return (packet[9], str(ipaddress.IPv4Address(packet[12:16])),
            str(ipaddress.IPv4Address(packet[16:20])), packet[header_len:])


@pytest.fixture
def ipip(modprobe):
    modprobe("ipip")


def test_ipip_module_loads_and_an_ipip_link_can_be_made(ipip, make_namespace):
    ns = make_namespace()
    ip_batch(ns, [f"link add name {TUNNEL_IF} type ipip local {UNDERLAY['a']} remote {UNDERLAY['b']}"])
    shown = subprocess.run(["ip", "-n", ns, "-d", "-j", "link", "show", TUNNEL_IF],
                           capture_output=True, text=True, check=True).stdout
    info = json.loads(shown)[0]["linkinfo"]
    assert info["info_kind"] == "ipip"
    assert (info["info_data"]["local"], info["info_data"]["remote"]) == (UNDERLAY["a"], UNDERLAY["b"])
    assert "ipip " in Path("/proc/modules").read_text()


@pytest.mark.parametrize("shape", list(TunnelShape), ids=lambda s: s.value)
def test_ping_crosses_the_tunnel_as_ip_protocol_4_carrying_inner_addresses(
        ipip, make_namespace, tmp_path, shape):
    if shutil.which("tcpdump") is None:
        pytest.skip("tcpdump is not installed (apt-get install tcpdump)")
    ns = {"a": make_namespace(), "b": make_namespace()}
    build_underlay(ns)
    for side in ("a", "b"):
        ip_batch(ns[side], tunnel_commands(side, shape=shape))
    pcap = tmp_path / "underlay.pcap"
    capture = start_capture(ns["b"], ifname=UNDERLAY_IF["b"], pcap=pcap, count=2 * PINGS)
    try:
        ping = namespaces.run_in(ns["a"], ["ping", "-c", str(PINGS), "-i", "0.2", "-W", "5",
                                           INNER["b"]], timeout=60)
        assert ping.returncode == 0, f"ping across the {shape.value} tunnel failed:\n{ping.stdout}{ping.stderr}"
        try:
            capture.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass  # fewer packets than expected: the assertion below shows which ones were seen
    finally:
        if capture.poll() is None:
            capture.kill()
        capture.wait()
        capture.stderr.close()

    seen = set()
    for packet in read_pcap_ipv4(pcap):
        outer_proto, outer_src, outer_dst, inner = ipv4_header(packet)
        inner_proto, inner_src, inner_dst, _ = ipv4_header(inner)
        assert outer_proto == IPPROTO_IPIP
        seen.add((outer_src, outer_dst, inner_proto, inner_src, inner_dst))
    assert seen == {
        (UNDERLAY["a"], UNDERLAY["b"], IPPROTO_ICMP, INNER["a"], INNER["b"]),
        (UNDERLAY["b"], UNDERLAY["a"], IPPROTO_ICMP, INNER["b"], INNER["a"]),
    }
