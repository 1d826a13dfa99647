"""A NodePort lab for the tc path's connection tracking (ebpf/nodeport.c), in two namespaces.

    out (10.78.0.2 the client, 10.78.0.3 a remote node's pod) -- veth -- node (10.78.0.1, ext0)

The tc programs sit on the node's `ext0`. The client connects to the NodePort
10.78.0.1:30080; the program DNATs to the backend 10.78.0.3:8080 and SNATs to the node
(tc_snat, a remote backend), the node forwards it back out of ext0, and the backend's replies
come back to ext0 and are translated to the client. So a flow whose conntrack entries are
lost is visible: its next packet gets a new SNAT port and the backend answers it with a RST.
`SynFlood` sends SYNs from many addresses and ports of 10.79.0.0/16 (raw frames from the out
namespace); `HeldConnections` opens N connections, echoes a byte on each when asked, and
closes chosen ones with FIN or RST. Used by tests/netns/test_ebpf_conntrack.py and
bench/ebpf_ct_flood.py. Everything is in namespaces this module creates.
`NodePortLab(family=IpFamily.V6)` is the same lab over IPv6 (fd78::1 the node, fd78::2 the
client, fd78::3 the backend; forwarding on); the flood is IPv4's only.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName
from tests.netns.topology import NamespaceTopology

NODE_IP, CLIENT_IP, BACKEND_IP = "10.78.0.1", "10.78.0.2", "10.78.0.3"
NODE_PORT = 30080
NODE = NodeContext(name="node-1", local_addresses=(NODE_IP,))
WEB = ServicePortName("default", "web")
# family -> (node, client, backend, cluster IP)
ADDRESSES = {IpFamily.V4: (NODE_IP, CLIENT_IP, BACKEND_IP, "10.96.0.80"),
             IpFamily.V6: ("fd78::1", "fd78::2", "fd78::3", "fd00:10:96::80")}


def nodeport_state(family: IpFamily = IpFamily.V4) -> ProxyState:
    node_ip, _, backend_ip, cluster_ip = ADDRESSES[family]
    service = ServicePort(name=WEB, protocol=Protocol.TCP, port=80, cluster_ip=cluster_ip, node_port=NODE_PORT)
    return ProxyState(node=NodeContext(name="node-1", local_addresses=(node_ip,), family=family),
                      services={WEB: service},
                      endpoints={WEB: (Endpoint(ip=backend_ip, port=8080, node_name="node-2"),)})


ECHO = r"""
import selectors, socket, sys
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 8080)); s.listen(4096); s.setblocking(False)
sel = selectors.DefaultSelector(); sel.register(s, selectors.EVENT_READ)
print("ready", flush=True)
while True:
    for key, _ in sel.select():
        if key.fileobj is s:
            try:
                c, _ = s.accept()
            except OSError:
                continue
            c.setblocking(False); sel.register(c, selectors.EVENT_READ)
            continue
        c = key.fileobj
        try:
            data = c.recv(4096)
        except OSError:
            data = b""
        if data:
            try:
                c.send(data)
            except OSError:
                pass
        else:
            sel.unregister(c); c.close()
"""


class NodePortLab(NamespaceTopology):
    def __init__(self, family: IpFamily = IpFamily.V4) -> None:
        super().__init__(["out", "node"])
        self.family = family
        self.node_ip, self.client_ip, self.backend_ip, _ = ADDRESSES[family]

    def _build(self) -> None:
        out, node = self.names["out"], self.names["node"]
        subprocess.run(["ip", "-n", node, "link", "add", "ext0", "type", "veth", "peer", "name", "out0",
                        "netns", out], check=True)
        for sysctl in ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.ext0.rp_filter=0",
                       "net.ipv4.conf.ext0.accept_local=1", "net.ipv4.conf.all.send_redirects=0",
                       "net.ipv4.conf.ext0.send_redirects=0", "net.ipv6.conf.all.forwarding=1"):
            self.run("node", "sysctl", "-qw", sysctl)
        if self.family is IpFamily.V6:
            self._build_v6()
            return
        self.run("node", "ip", "addr", "add", f"{NODE_IP}/24", "dev", "ext0")
        self.run("node", "ip", "link", "set", "ext0", "up")
        self.run("node", "ip", "link", "set", "lo", "up")
        self.run("node", "ip", "route", "add", "10.79.0.0/16", "via", CLIENT_IP)   # the flood's replies
        for address in (CLIENT_IP, BACKEND_IP):
            self.run("out", "ip", "addr", "add", f"{address}/24", "dev", "out0")
        self.run("out", "ip", "link", "set", "out0", "up")
        self.run("out", "ip", "link", "set", "lo", "up")
        self.start_server("out", [sys.executable, "-c", ECHO, BACKEND_IP])

    def _build_v6(self) -> None:
        self.run("node", "ip", "addr", "add", f"{self.node_ip}/64", "dev", "ext0", "nodad")
        self.run("node", "ip", "link", "set", "ext0", "up")
        self.run("node", "ip", "link", "set", "lo", "up")
        for address in (self.client_ip, self.backend_ip):
            self.run("out", "ip", "addr", "add", f"{address}/64", "dev", "out0", "nodad")
        self.run("out", "ip", "link", "set", "out0", "up")
        self.run("out", "ip", "link", "set", "lo", "up")
        self.start_server("out", [sys.executable, "-c", ECHO, self.backend_ip])

    def node_mac(self) -> str:
        return self.run("node", "cat", "/sys/class/net/ext0/address").stdout.strip()

    def attach(self, fds: dict[str, int]) -> None:
        """The tc programs on the node's ext0 (the underlay)."""
        from ebpf.tc import attach_tc
        fd = os.open(namespaces.netns_path(self.names["node"]), os.O_RDONLY)
        try:
            with namespaces.entered(fd):
                attach_tc("ext0", fds)
        finally:
            os.close(fd)


FLOOD = r"""
import errno, socket, struct, sys, time
count, dst_mac = int(sys.argv[1]), bytes.fromhex(sys.argv[2].replace(":", ""))
node_ip, port = sys.argv[3], int(sys.argv[4])
def csum(data):
    if len(data) % 2: data += b"\0"
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while total >> 16: total = (total & 0xffff) + (total >> 16)
    return ~total & 0xffff
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind(("out0", 0))
src_mac = s.getsockname()[4]
daddr = socket.inet_aton(node_ip)
sent = 0
for i in range(count):
    saddr = bytes([10, 79, (i // 250) % 256, i % 250 + 1])
    sport = 1024 + (i * 7919) % 60000
    tcp = struct.pack("!HHIIBBHHH", sport, port, i * 2654435761 % 2**32, 0, 5 << 4, 0x02, 64240, 0, 0)
    tcp = tcp[:16] + struct.pack("!H", csum(saddr + daddr + struct.pack("!BBH", 0, 6, len(tcp)) + tcp)) + tcp[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), i % 65536, 0, 64, 6, 0, saddr, daddr)
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    while True:
        try:
            s.send(dst_mac + src_mac + b"\x08\x00" + ip + tcp)
            break
        except OSError as error:   # ENOBUFS: the device's queue is full, let it drain
            if error.errno != errno.ENOBUFS:
                raise
            time.sleep(0.001)
    sent += 1
print(sent)
"""


def syn_flood(lab: NodePortLab, count: int) -> int:
    """`count` SYNs to the NodePort, each from its own address and port; how many were sent."""
    done = subprocess.run([*namespaces.exec_prefix(lab.names["out"]), sys.executable, "-c", FLOOD, str(count),
                           lab.node_mac(), NODE_IP, str(NODE_PORT)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


HOLDER = r"""
import json, select, socket, struct, sys, time
count, node_ip, port, client_ip = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
conns = []
for _ in range(count):
    c = socket.socket(socket.AF_INET6 if ":" in node_ip else socket.AF_INET)
    c.bind((client_ip, 0)); c.settimeout(60); c.connect((node_ip, port))
    c.sendall(b"h"); assert c.recv(1) == b"h"   # established end to end, and confirmed by the tc path
    conns.append(c)
print(json.dumps([c.getsockname()[1] for c in conns]), flush=True)
for line in sys.stdin:
    words = line.split()
    if words[0] == "check":   # one byte each way on every open connection: did it come back?
        ok = []
        for c in conns:
            if c is None:
                ok.append(None); continue
            try:
                c.settimeout(30); c.sendall(b"x"); ok.append(c.recv(1) == b"x")
            except OSError:
                ok.append(False)
        print(json.dumps(ok), flush=True)
    elif words[0] in ("fin", "rst"):
        for i in map(int, words[1:]):
            if words[0] == "rst":
                conns[i].setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conns[i].close()
            else:
                conns[i].shutdown(socket.SHUT_WR)
                conns[i].settimeout(30)
                while conns[i].recv(64):   # until the backend's FIN
                    pass
                conns[i].close()
            conns[i] = None
        print("done", flush=True)
"""


class HeldConnections:
    """`count` connections from the client to the NodePort, held open by a process in `out`."""

    def __init__(self, lab: NodePortLab, count: int) -> None:
        self.process = subprocess.Popen([*namespaces.exec_prefix(lab.names["out"]), sys.executable, "-c", HOLDER,
                                         str(count), lab.node_ip, str(NODE_PORT), lab.client_ip],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if not line:
            self.close()
            raise RuntimeError("the client could not establish its connections")
        self.ports: list[int] = json.loads(line)

    def _ask(self, command: str) -> str:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline()

    def check(self) -> list[bool | None]:
        """Per connection: True when a byte went through and came back, None when closed."""
        return json.loads(self._ask("check"))

    def close_some(self, how: str, indexes: list[int]) -> None:
        assert self._ask(f"{how} " + " ".join(map(str, indexes))).strip() == "done"

    def close(self) -> None:
        self.process.kill()
        self.process.wait()

    def __enter__(self) -> HeldConnections:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
