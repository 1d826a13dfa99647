"""The IPVS backend's kernel touchpoints without a kernel: FakeIpvsTable refuses what the kernel
refuses, the netlink records are built and parsed as the kernel speaks them (checked against
the guest kernel in tests/vm/guest/test_ipvs_backend.py), sysctls are written only when they
differ, and the rules are repaired only when they drift."""
import errno
import socket
import sys

import pytest
from pyroute2.netlink.generic import ipvs as genl

from netagent.kernel.fake_sysctl import FakeSysctls
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.sysctl import ProcSysctls, Sysctl, ensure_sysctls
from proxy.ipvs.fake_table import FakeIpvsTable
from proxy.ipvs.graceful import GracefulRemovals, Removal
from proxy.ipvs.netlink import _dest_record, _full_service_record, _parse_dest, _parse_service
from proxy.ipvs.rules import ensure_ipvs_rules, remove_ipvs_rules, render_ipvs_chains
from proxy.ipvs.table import Destination, IpvsError, RealServer, RealServerStatus, VirtualServer, VirtualServerKey
from proxy.model import Protocol

KEY = VirtualServerKey("10.96.0.10", Protocol.TCP, 80)
POD = Destination("10.244.1.5", 8080)


def test_fake_table_refuses_what_the_kernel_refuses():
    table = FakeIpvsTable()
    table.add_virtual_server(VirtualServer(KEY))
    with pytest.raises(IpvsError) as caught:
        table.add_virtual_server(VirtualServer(KEY))
    assert caught.value.code == errno.EEXIST
    with pytest.raises(IpvsError) as caught:
        table.add_virtual_server(VirtualServer(VirtualServerKey("10.96.0.11", Protocol.TCP, 80), scheduler="nope"))
    assert caught.value.code == errno.ENOENT
    with pytest.raises(IpvsError) as caught:
        table.add_real_server(VirtualServerKey("10.96.0.99", Protocol.TCP, 80), RealServer(POD))
    assert caught.value.code == errno.ESRCH
    table.add_real_server(KEY, RealServer(POD))
    with pytest.raises(IpvsError) as caught:
        table.add_real_server(KEY, RealServer(POD))
    assert caught.value.code == errno.EEXIST
    with pytest.raises(IpvsError) as caught:
        table.update_real_server(KEY, RealServer(Destination("10.244.1.6", 8080), 0))
    assert caught.value.code == errno.ENOENT
    with pytest.raises(IpvsError):
        table.update_real_server(KEY, RealServer(POD, -1))
    with pytest.raises(IpvsError):
        table.add_real_server(KEY, RealServer(Destination("fe80::1", 80)))


def test_fake_table_deletes_quietly_and_keeps_counters_on_weight_change():
    table = FakeIpvsTable()
    table.add_virtual_server(VirtualServer(KEY))
    table.add_real_server(KEY, RealServer(POD))
    table.set_connections(KEY, POD, active=2, inactive=1)
    table.update_real_server(KEY, RealServer(POD, 0))
    assert table.real_servers(KEY) == [RealServerStatus(POD, 0, 2, 1)]
    table.update_virtual_server(VirtualServer(KEY, scheduler="sh", persistence_timeout=60))
    assert table.real_servers(KEY) == [RealServerStatus(POD, 0, 2, 1)], "updating a service keeps its reals"
    writes = len(table.writes)
    table.delete_real_server(KEY, Destination("10.244.9.9", 1))
    table.delete_virtual_server(VirtualServerKey("10.96.0.99", Protocol.TCP, 80))
    assert len(table.writes) == writes
    table.delete_virtual_server(KEY)
    assert table.virtual_servers() == [] and table.real_servers(KEY) == []


def test_graceful_decisions():
    removals = GracefulRemovals(timeout=10)
    busy = RealServerStatus(POD, 1, active_connections=1)
    assert removals.decide(KEY, busy, now=100) is Removal.DRAIN
    assert removals.decide(KEY, busy, now=109.9) is Removal.DRAIN
    assert removals.deadline() == 110
    assert removals.decide(KEY, busy, now=110) is Removal.DELETE
    assert removals.draining() == frozenset()
    assert removals.decide(KEY, RealServerStatus(POD, 0, inactive_connections=0), now=0) is Removal.DELETE
    udp = VirtualServerKey("10.96.0.10", Protocol.UDP, 53)
    assert removals.decide(udp, busy, now=0) is Removal.DELETE
    assert removals.decide(KEY, busy, now=0) is Removal.DRAIN
    removals.forget(KEY)
    assert removals.deadline() is None


def _service_message(**attrs):
    message = genl.ipvsmsg()
    message["attrs"] = [("IPVS_CMD_ATTR_SERVICE", {"attrs": list(attrs.items())})]
    message.encode()
    decoded = genl.ipvsmsg(message.data)
    decoded.decode()
    return decoded


def test_netlink_service_records_round_trip():
    server = VirtualServer(KEY, scheduler="rr", persistence_timeout=600)
    record = dict(_full_service_record(server).dump_nla()["attrs"])
    assert record["IPVS_SVC_ATTR_FLAGS"] == {"flags": 1, "mask": 1}
    assert (record["IPVS_SVC_ATTR_TIMEOUT"], record["IPVS_SVC_ATTR_SCHED_NAME"]) == (600, "rr")
    assert record["IPVS_SVC_ATTR_NETMASK"] == "255.255.255.255"
    # what the kernel answers: AF, the hashed flag set, the timeout even when not persistent
    answered = _service_message(IPVS_SVC_ATTR_AF=socket.AF_INET, IPVS_SVC_ATTR_PROTOCOL=6,
                                IPVS_SVC_ATTR_ADDR="10.96.0.10", IPVS_SVC_ATTR_PORT=80,
                                IPVS_SVC_ATTR_SCHED_NAME="rr", IPVS_SVC_ATTR_FLAGS={"flags": 3, "mask": 0xFFFFFFFF},
                                IPVS_SVC_ATTR_TIMEOUT=600)
    assert _parse_service(answered) == server
    plain = _service_message(IPVS_SVC_ATTR_AF=socket.AF_INET, IPVS_SVC_ATTR_PROTOCOL=17,
                             IPVS_SVC_ATTR_ADDR="10.96.0.10", IPVS_SVC_ATTR_PORT=53, IPVS_SVC_ATTR_SCHED_NAME="rr",
                             IPVS_SVC_ATTR_FLAGS={"flags": 2, "mask": 0xFFFFFFFF}, IPVS_SVC_ATTR_TIMEOUT=0)
    assert _parse_service(plain) == VirtualServer(VirtualServerKey("10.96.0.10", Protocol.UDP, 53))
    esp = _service_message(IPVS_SVC_ATTR_AF=socket.AF_INET, IPVS_SVC_ATTR_PROTOCOL=50,
                           IPVS_SVC_ATTR_ADDR="10.96.0.10", IPVS_SVC_ATTR_PORT=0)
    assert _parse_service(esp) is None


def test_netlink_real_servers_are_nat():
    record = dict(_dest_record(RealServer(POD, 0)).dump_nla()["attrs"])
    assert record["IPVS_DEST_ATTR_FWD_METHOD"] == 0, "pyroute2 defaults to direct routing"
    assert (record["IPVS_DEST_ATTR_ADDR"], record["IPVS_DEST_ATTR_PORT"], record["IPVS_DEST_ATTR_WEIGHT"]) == \
        ("10.244.1.5", 8080, 0)
    message = genl.ipvsmsg()
    message["attrs"] = [("IPVS_CMD_ATTR_DEST", {"attrs": [
        ("IPVS_DEST_ATTR_ADDR_FAMILY", socket.AF_INET), ("IPVS_DEST_ATTR_ADDR", "10.244.1.5"),
        ("IPVS_DEST_ATTR_PORT", 8080), ("IPVS_DEST_ATTR_WEIGHT", 1), ("IPVS_DEST_ATTR_ACTIVE_CONNS", 3),
        ("IPVS_DEST_ATTR_INACT_CONNS", 4)]})]
    message.encode()
    decoded = genl.ipvsmsg(message.data)
    decoded.decode()
    assert _parse_dest(decoded) == RealServerStatus(POD, 1, 3, 4)


def test_sysctls_written_only_when_they_differ():
    sysctls = FakeSysctls({"net.ipv4.vs.conntrack": "0", "net.ipv4.ip_forward": "1"})
    wanted = [Sysctl("net.ipv4.vs.conntrack", "1", ""), Sysctl("net.ipv4.ip_forward", "1", "")]
    assert ensure_sysctls(sysctls, wanted) == ["net.ipv4.vs.conntrack=1"]
    assert ensure_sysctls(sysctls, wanted) == []
    with pytest.raises(LookupError, match="vs.sloppy_tcp"):
        ensure_sysctls(sysctls, [Sysctl("net.ipv4.vs.sloppy_tcp", "1", "")])


def test_proc_sysctls_read_and_write_files(tmp_path):
    (tmp_path / "net" / "ipv4" / "vs").mkdir(parents=True)
    (tmp_path / "net" / "ipv4" / "vs" / "conntrack").write_text("0\n")
    sysctls = ProcSysctls(root=tmp_path)
    assert sysctls.read("net.ipv4.vs.conntrack") == "0"
    assert sysctls.read("net.ipv4.vs.missing") is None
    sysctls.write("net.ipv4.vs.conntrack", "1")
    assert (tmp_path / "net" / "ipv4" / "vs" / "conntrack").read_text() == "1"


def test_rules_are_written_once_and_repaired_on_drift():
    iptables = FakeIptables()
    iptables.restore("*filter\n-A INPUT -s 192.0.2.0/24 -j DROP\nCOMMIT\n")
    chains = render_ipvs_chains(cluster_cidr="10.244.0.0/16")
    assert ensure_ipvs_rules(iptables, chains)
    assert len(iptables.restores) == 2, "one restore for both tables"
    assert ensure_ipvs_rules(iptables, chains) == []
    assert len(iptables.restores) == 2
    forward = iptables.table("filter").chains["FORWARD"].rules
    assert [rule[-1] for rule in forward] == ["NETAGENT-IPVS-FILTER", "NETAGENT-IPVS-FORWARD"]
    assert iptables.table("filter").chains["INPUT"].rules[-1] == ("-s", "192.0.2.0/24", "-j", "DROP")
    iptables.restore("*nat\n-D OUTPUT -m comment --comment \"netagent: ipvs services\" -j NETAGENT-IPVS-SVCS\nCOMMIT\n")
    assert ensure_ipvs_rules(iptables, chains) == ["nat OUTPUT: no jump to NETAGENT-IPVS-SVCS"]
    assert ensure_ipvs_rules(iptables, chains) == []
    remove_ipvs_rules(iptables, chains)
    assert "NETAGENT" not in iptables.save()
    assert iptables.table("filter").chains["INPUT"].rules == [("-s", "192.0.2.0/24", "-j", "DROP")]


def test_netlink_ipv6_records_are_af_inet6_with_a_128_bit_host_netmask():
    key6 = VirtualServerKey("fd00:10:96::a", Protocol.TCP, 80)
    record = dict(_full_service_record(VirtualServer(key6, scheduler="rr")).dump_nla()["attrs"])
    assert (record["IPVS_SVC_ATTR_AF"], record["IPVS_SVC_ATTR_ADDR"]) == (socket.AF_INET6, "fd00:10:96::a")
    # the kernel reads an AF_INET6 netmask as a prefix length in host byte order (1..128)
    assert int.from_bytes(socket.inet_aton(record["IPVS_SVC_ATTR_NETMASK"]), sys.byteorder) == 128
    dest = dict(_dest_record(RealServer(Destination("fd00:10:244:1::5", 8080))).dump_nla()["attrs"])
    assert (dest["IPVS_DEST_ATTR_ADDR_FAMILY"], dest["IPVS_DEST_ATTR_FWD_METHOD"]) == (socket.AF_INET6, 0)
    answered = _service_message(IPVS_SVC_ATTR_AF=socket.AF_INET6, IPVS_SVC_ATTR_PROTOCOL=6,
                                IPVS_SVC_ATTR_ADDR="fd00:10:96::a", IPVS_SVC_ATTR_PORT=80,
                                IPVS_SVC_ATTR_SCHED_NAME="rr", IPVS_SVC_ATTR_FLAGS={"flags": 2, "mask": 0xFFFFFFFF},
                                IPVS_SVC_ATTR_TIMEOUT=0)
    parsed = _parse_service(answered)
    assert parsed == VirtualServer(key6) and parsed.key.family.value == 6
