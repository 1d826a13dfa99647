"""Issue 10's defects on the real kernel, through the agent and in-process: hostile input gets
its code and leaves no veth, no pod interface and no reservation; a DEL racing its ADD, and
an agent killed with -9 in the middle of ADDs, never leave an address owned twice.

Each test builds a lab node (tests/netns/conftest.py) and executes the installed plugin as a
runtime would; `where` runs it through the agent and in-process (the Python client without
an agent).
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from cni import invoke
from netagent.kernel import namespaces
from tests.netns.test_cni_plugin import assert_clean, our_veths, reservations


def pod_eth0(node, netns_name: str) -> bool:
    return "eth0" in namespaces.run_in(netns_name, ["ip", "-o", "link"]).stdout


def assert_untouched(node, netns_name: str) -> None:
    node.settle()
    assert our_veths(node) == [] and reservations(node) == []
    assert not pod_eth0(node, netns_name)


def test_a_network_name_too_long_for_the_alias_is_code_7_and_leaks_no_veth(make_node, where):
    node = make_node(with_agent=(where == "agent"))
    netns_name = node.new_pod_netns("x")
    for length in (246, 247, 1024):
        code, out = node.cni("ADD", container_id="c1", netns=namespaces.netns_path(netns_name),
                             config=node.plugin_config(name="n" * length))
        assert (code, out["code"]) == (1, 7), out
        assert_untouched(node, netns_name)
    code, out = node.cni("ADD", container_id="c1", netns=namespaces.netns_path(netns_name),
                         config=node.plugin_config(name="n" * 245))
    assert code == 0, out  # the longest name the kernel's alias holds works
    assert node.cni("DEL", container_id="c1", netns=namespaces.netns_path(netns_name),
                    config=node.plugin_config(name="n" * 245))[0] == 0


@pytest.mark.parametrize("prev", [{"interfaces": 5}, {"ips": True}, {"ips": [{"address": "bogus"}]}])
def test_a_malformed_prev_result_is_code_7_with_nothing_built(make_node, where, prev):
    node = make_node(with_agent=(where == "agent"))
    netns_name = node.new_pod_netns("x")
    netns = namespaces.netns_path(netns_name)
    code, out = node.cni("ADD", container_id="c1", netns=netns, config=node.plugin_config(prev_result=prev))
    assert (code, out["code"]) == (1, 7), out
    assert_untouched(node, netns_name)
    assert node.cni("ADD", container_id="c1", netns=netns)[0] == 0  # the retry is not refused with 104
    assert node.cni("DEL", container_id="c1", netns=netns)[0] == 0
    assert_clean(node)


def test_a_trailing_newline_cannot_release_a_running_pods_address(make_node, where):
    node = make_node(with_agent=(where == "agent"))
    pod = node.add_pod("abc")
    held = reservations(node)
    code, out = node.cni("DEL", container_id=pod.container_id + "\n", netns=pod.netns)
    assert (code, out["code"]) == (1, 4)
    code, out = node.cni("DEL", container_id=pod.container_id, ifname="eth0\n", netns=pod.netns)
    assert (code, out["code"]) == (1, 4)
    node.settle()
    assert reservations(node) == held
    other = node.add_pod("other")
    assert other.ip != pod.ip and node.ping("other", pod.ip)


@pytest.mark.parametrize("kind", ["file", "directory", "mount-namespace", "dev-null", "fifo"])
def test_cni_netns_that_is_no_network_namespace_is_code_4(make_node, where, tmp_path, kind):
    node = make_node(with_agent=(where == "agent"))
    paths = {"file": tmp_path / "plain", "directory": tmp_path, "mount-namespace": "/proc/self/ns/mnt",
             "dev-null": "/dev/null", "fifo": tmp_path / "fifo"}
    (tmp_path / "plain").write_text("")
    os.mkfifo(tmp_path / "fifo")
    code, out = node.cni("ADD", container_id="c1", netns=str(paths[kind]))
    assert (code, out["code"]) == (1, 4), out
    assert "not a network namespace" in out["msg"]
    node.settle()
    assert our_veths(node) == [] and reservations(node) == []


def test_fifos_cannot_wedge_the_agent(make_node, tmp_path):
    """Eight ADDs naming a FIFO (resolvConf, CNI_NETNS) used to hold all eight workers forever."""
    node = make_node()
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    bad_ipam = dict(json.loads(node.plugin_config())["ipam"], resolvConf=fifo)
    names = [node.new_pod_netns(f"f{i}") for i in range(8)]

    def hostile(i: int):
        if i % 2:
            return node.cni("ADD", container_id=f"f{i}", netns=fifo)
        return node.cni("ADD", container_id=f"f{i}", netns=namespaces.netns_path(names[i]),
                        config=node.plugin_config(ipam=bad_ipam))

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(hostile, range(8)))
    assert [out["code"] for _, out in answers] == [7, 4] * 4, answers
    good = node.add_pod("good")  # the agent still serves
    assert our_veths(node) == [good.result["interfaces"][1]["name"]]
    assert reservations(node) == [good.ip]
    assert not any(pod_eth0(node, name) for name in names)


def test_non_utf8_environment_bytes_are_code_4(make_node, where):
    node = make_node(with_agent=(where == "agent"))
    netns_name = node.new_pod_netns("x")
    env = invoke.cni_environment(command="ADD", container_id="c1", netns=namespaces.netns_path(netns_name),
                                 ifname="eth0", args="", path=(node.bin_dir,))
    raw = {k.encode(): v.encode() for k, v in env.items()}
    raw[b"CNI_ARGS"] = b"K8S_POD_NAME=\xff\xfe"
    proc = subprocess.run([*namespaces.exec_prefix(node.node), os.path.join(node.bin_dir, "netagent")],
                          input=node.plugin_config(), env=raw, capture_output=True, timeout=120)
    out = json.loads(proc.stdout)
    assert (proc.returncode, out["code"]) == (1, 4) and "UTF-8" in out["msg"], proc
    assert_untouched(node, netns_name)


def test_del_racing_add_leaves_the_veth_exactly_when_the_reservation(make_node, where):
    node = make_node(with_agent=(where == "agent"))
    netns = namespaces.netns_path(node.new_pod_netns("race"))
    trials = 8
    for trial in range(trials):
        barrier = threading.Barrier(2)
        answers: dict = {}

        def run(command: str) -> None:
            barrier.wait()
            answers[command] = node.cni(command, container_id="racer", netns=netns)

        threads = [threading.Thread(target=run, args=(c,)) for c in ("ADD", "DEL")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert answers["DEL"][0] == 0 and answers["ADD"][0] == 0, (trial, answers)
        node.settle()
        veths, held = our_veths(node), reservations(node)
        assert len(veths) == len(held) <= 1, (trial, veths, held)
        if veths:  # the ADD came last: the pod has the reserved address and can use it
            address = held[0]
            assert address in namespaces.run_in(f"{node.prefix}-race", ["ip", "-o", "addr"]).stdout
        assert node.cni("DEL", container_id="racer", netns=netns)[0] == 0
        assert_clean(node)


def test_agent_killed_during_adds_leaves_no_address_owned_twice(make_node):
    """kill -9 with ADDs truly in flight: the test holds the IPAM store's lock, so the agent has
    created the veths and waits for the reservations when it dies. The runtime then sees 11,
    its DELs clean up, and no address is held twice, neither by the pods that were running
    nor by the pod added after the restart."""
    node = make_node(subnets=("10.244.20.0/24",))
    running = [node.add_pod(f"r{i}") for i in range(3)]
    count = 8
    names = [node.new_pod_netns(f"k{i}") for i in range(count)]
    store_dir = os.path.join(node.data_dir, "netagent")
    lock = os.open(os.path.join(store_dir, "lock"), os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        with ThreadPoolExecutor(max_workers=count) as pool:
            futures = [pool.submit(node.cni, "ADD", container_id=f"k{i}", netns=namespaces.netns_path(names[i]))
                       for i in range(count)]
            # Every ADD must be in the agent's hands before the kill: a client that found no
            # agent listening would run in-process and wait for the lock this test holds.
            deadline = time.monotonic() + 60
            while len(our_veths(node)) < len(running) + count and time.monotonic() < deadline:
                time.sleep(0.01)
            in_flight = len(our_veths(node)) - len(running)
            assert in_flight == count, f"only {in_flight} of {count} ADDs reached the agent in 60 s"
            node.stop_agent(sig=signal.SIGKILL)
            answers = [f.result() for f in futures]
    finally:
        os.close(lock)
    assert all(code == 1 and out["code"] == 11 for code, out in answers), answers
    node.start_agent()
    fresh = node.add_pod("fresh")
    addresses = [pod.ip for pod in running] + [fresh.ip]
    assert len(set(addresses)) == len(addresses)
    assert sorted(reservations(node)) == sorted(addresses)
    for i in range(count):  # the runtime DELs every container whose ADD failed
        assert node.cni("DEL", container_id=f"k{i}", netns=namespaces.netns_path(names[i]))[0] == 0
    for pod in running + [fresh]:
        node.delete_pod(pod.name)
    assert_clean(node)
    print(f"\nkill -9 with {in_flight} of {count} ADDs holding a veth and waiting for IPAM: all {count} "
          f"answered 11; after the restart and the runtime's DELs nothing was left")


def test_agent_killed_during_dels_finishes_them_after_restart(make_node):
    """kill -9 with a DEL truly in flight: acknowledged and journaled, its veth deleted, its
    release waiting for the IPAM store's lock (held by the test). The restarted agent replays
    the journal: every reservation is released and nothing of the pods is left."""
    node = make_node(subnets=("10.244.21.0/24",))
    pods = [node.add_pod(f"d{i}") for i in range(4)]
    lock = os.open(os.path.join(node.data_dir, "netagent", "lock"), os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        for pod in pods:
            assert node.cni("DEL", container_id=pod.container_id, netns=pod.netns)[0] == 0
        deadline = time.monotonic() + 30
        while len(our_veths(node)) == len(pods) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(our_veths(node)) < len(pods), "no DEL reached the kernel"
        assert node.pending_deletes() == len(pods) and len(reservations(node)) == len(pods)
        node.stop_agent(sig=signal.SIGKILL)
    finally:
        os.close(lock)
    node.pods.clear()
    node.start_agent()
    assert_clean(node)


def test_a_relative_data_dir_is_refused_on_both_paths_alike(make_node, where):
    """It used to resolve against the agent's working directory through the agent and the
    runtime's in-process: one config, two address spaces, one address for two pods."""
    node = make_node(with_agent=(where == "agent"))
    netns_name = node.new_pod_netns("x")
    ipam = dict(json.loads(node.plugin_config())["ipam"], dataDir="relative/ipam")
    code, out = node.cni("ADD", container_id="c1", netns=namespaces.netns_path(netns_name),
                         config=node.plugin_config(ipam=ipam))
    assert (code, out["code"]) == (1, 7) and "absolute" in out["msg"]
    assert_untouched(node, netns_name)
