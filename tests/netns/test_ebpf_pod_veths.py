"""PodVethAttacher in a test-made namespace: the tc path goes onto every pod host veth (the CNI
plugin's `na` + 12 hex digits) there at start and onto each one made later, onto nothing else,
and `detach_tc` takes it off again. (Packets through it: the cluster tier, a pod outside the
cgroup reaching services; the programs' translations: test_ebpf_nodeport.py.)"""
import os
import subprocess
import sys

from ebpf.loader import SocketLbLoader
from ebpf.pod_veths import PodVethAttacher
from netagent.kernel import namespaces
from tests.cluster.lab_tools import wait_for
from tests.netns.ebpf_fixtures import bpf_root, require_bcc, test_cgroup  # noqa: F401


def filters(netns: str, device: str) -> set[str]:
    found = set()
    for hook in ("ingress", "egress"):
        out = namespaces.run_in(netns, ["tc", "filter", "show", "dev", device, hook]).stdout
        found.update(f"{hook} {word}" for word in out.split() if word.startswith("na_tc_"))
    return found


def veth(netns: str, name: str) -> None:
    namespaces.run_in(netns, ["ip", "link", "add", name, "type", "veth", "peer", "name", f"p{name[-8:]}"],
                      check=True)


def test_every_pod_veth_gets_the_tc_path_as_it_appears_and_nothing_else_does(bpf_root, test_cgroup):  # noqa: F811
    require_bcc()
    netns = namespaces.unique_name("na-t")
    namespaces.create(netns)
    try:
        veth(netns, "na0123456789ab")                  # a pod veth there before the agent
        veth(netns, "na-other0")                       # ours, but no pod's
        with SocketLbLoader(bpf_root=bpf_root, cgroup=test_cgroup).load_tc() as programs:
            fds = {name: os.dup(programs.fds[name]) for name in ("na_tc_from_pod", "na_tc_egress")}
        attacher = PodVethAttacher(fds)
        fd = os.open(namespaces.netns_path(netns), os.O_RDONLY)
        try:
            with namespaces.entered(fd):   # its netlink sockets and its thread belong to the test namespace
                attacher.start()
        finally:
            os.close(fd)
        try:
            expected = {"ingress na_tc_from_pod", "egress na_tc_egress"}
            assert filters(netns, "na0123456789ab") == expected
            veth(netns, "nafedcba987654")                # a pod made later
            wait_for(lambda: filters(netns, "nafedcba987654") == expected, timeout=60, what="the new pod veth")
            assert filters(netns, "na-other0") == set() and filters(netns, "pba987654") == set()   # not pods' ends
            namespaces.run_in(netns, ["ip", "link", "del", "nafedcba987654"], check=True)
            veth(netns, "nafedcba987654")                # the same name again: a new device
            wait_for(lambda: filters(netns, "nafedcba987654") == expected, timeout=60, what="the re-made pod veth")
        finally:
            attacher.stop()
        assert attacher.fds == {}
        removed = subprocess.run([*namespaces.exec_prefix(netns), sys.executable, "-c",
                                  "from ebpf.tc import detach_tc; print(len(detach_tc()))"],
                                 capture_output=True, text=True, cwd=os.getcwd(), timeout=60)
        assert removed.stdout.split() == ["4"], removed.stderr
        assert filters(netns, "na0123456789ab") == set() and filters(netns, "nafedcba987654") == set()
    finally:
        namespaces.remove(netns)
