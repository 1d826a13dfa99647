"""The fault-injection tier: every step of ADD fails in turn, and afterwards the node is as before.

Two seams inject: the stateful kernel fake (`FakeCniKernel.fail_at`, each netlink step of ADD
failing before or after doing its work) and the IPAM store fake (`FakeStore.fail_on`, each
write of the store failing). Unlike the rollback test of test_cni_handlers.py (an empty node,
"nothing left"), the node here already carries a running pod, the shared bridge and other
reservations, and after every failure the whole snapshot of `cni_fuzz_world.World` (links,
addresses, routes, neighbours, sysctls, open handles, reservation files) must equal the one
taken before the ADD. The round-robin hint `last_reserved_ip.<n>` is not part of the state:
like host-local's, it may advance, and it never hands out an address that is held.
DEL is checked the same way: a failed write leaves a state the runtime's retry completes.
"""
from __future__ import annotations

import errno
import json

import pytest

from cni.dispatch import execute
from cni.fake_kernel import Timing
from cni.ipam.builtin import BuiltinIpam
from cni.ipam.fake_store import FakeStore
from cni.wiring import host_veth_name
from netagent.kernel.errors import KernelError
from tests.unit.cni.cni_fuzz_world import PODS, Path, World

NETWORK = "faultnet"
MODES = {
    "bridge-dual-stack-hairpin": dict(mode="bridge", hairpinMode=True, subnets=("10.66.0.0/24", "fd00:66::/64")),
    "bridge": dict(mode="bridge", subnets=("10.66.0.0/24",)),
    "routed-dual-stack": dict(mode="routed", subnets=("10.66.0.0/24", "fd00:66::/64")),
    "bridge-ipv6": dict(mode="bridge", subnets=("fd00:66::/64",)),
    "routed-ipv6": dict(mode="routed", subnets=("fd00:66::/64",)),
}


def config(world: World, *, mode: str, subnets: tuple, **extra) -> bytes:
    return json.dumps({"cniVersion": "1.0.0", "name": NETWORK, "type": "netagent", "mode": mode, **extra,
                       "ipam": {"type": "netagent", "dataDir": world.data_dirs[0],
                                "ranges": [[{"subnet": s}] for s in subnets]}}).encode()


def env(command: str, container_id: str, netns: str) -> dict:
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_IFNAME": "eth0", "CNI_NETNS": netns,
            "CNI_PATH": "/nonexistent"}


def request(world: World, command: str, container_id: str, netns: str, stdin: bytes) -> tuple[int, dict | None]:
    code, out = world.request(env(command, container_id, netns), stdin)
    return code, json.loads(out) if out.strip() else None


@pytest.fixture
def world():
    made = World(Path.IN_PROCESS)
    yield made
    made.close()


def ready(world: World, stdin: bytes) -> None:
    """A node with a running pod (so the bridge, forwarding and other reservations exist)."""
    code, out = request(world, "ADD", "running", PODS[0], stdin)
    assert code == 0, out


@pytest.mark.parametrize("timing", list(Timing), ids=lambda t: t.value)
@pytest.mark.parametrize("case", sorted(MODES))
def test_each_kernel_step_of_add_failing_leaves_the_node_as_it_was(world, case, timing):
    stdin = config(world, **MODES[case])
    ready(world, stdin)
    kernel = world.kernel
    kernel.calls.clear()
    assert request(world, "ADD", "probe", PODS[1], stdin)[0] == 0
    steps = list(kernel.calls)
    assert request(world, "DEL", "probe", PODS[1], stdin)[0] == 0
    assert "create_veth" in steps and "configure_pod" in steps
    for step, operation in enumerate(steps, start=1):
        before = world.snapshot()
        kernel.calls.clear()
        kernel.fail_at(step, timing=timing)
        code, out = request(world, "ADD", "victim", PODS[1], stdin)
        where = f"step {step} ({operation}, {timing.value})"
        assert code == 1 and out["code"] in (100, 11), (where, out)
        assert kernel.calls[step - 1] == operation, where
        assert world.snapshot() == before, where
        # the runtime's retry succeeds and its DEL restores the state once more
        assert request(world, "ADD", "victim", PODS[1], stdin)[0] == 0, where
        assert request(world, "DEL", "victim", PODS[1], stdin)[0] == 0, where
        assert world.snapshot() == before, where


def store_world(world: World) -> FakeStore:
    """Route this world's IPAM to one FakeStore (whatever the config's data directory)."""
    store = FakeStore()
    world.handlers.ipam_for = lambda conf: BuiltinIpam(store_for=lambda ipam: store)
    return store


def store_state(world: World, store: FakeStore) -> tuple:
    return dict(store.files), world.snapshot()


@pytest.mark.parametrize("case", sorted(MODES))
def test_each_store_write_of_add_failing_leaves_the_node_as_it_was(world, case):
    store = store_world(world)
    stdin = config(world, **MODES[case])
    ready(world, stdin)
    store.writes.clear()
    assert request(world, "ADD", "probe", PODS[1], stdin)[0] == 0
    writes = list(store.writes)
    assert writes.count("reserve") == len(MODES[case]["subnets"]) and "set_last_reserved" in writes
    assert request(world, "DEL", "probe", PODS[1], stdin)[0] == 0
    for index, operation in enumerate(writes):
        nth = writes[:index + 1].count(operation)
        before = store_state(world, store)
        store.fail_on(operation, nth=nth)
        code, out = request(world, "ADD", "victim", PODS[1], stdin)
        where = f"write {index + 1} ({operation} #{nth})"
        assert (code, out["code"]) == (1, 5), (where, out)
        assert store_state(world, store) == before, where
        assert request(world, "ADD", "victim", PODS[1], stdin)[0] == 0, where
        assert request(world, "DEL", "victim", PODS[1], stdin)[0] == 0, where
        assert store_state(world, store) == before, where


def test_a_del_whose_release_fails_is_completed_by_the_retry(world):
    store = store_world(world)
    stdin = config(world, **MODES["routed-dual-stack"])
    ready(world, stdin)
    before = store_state(world, store)
    assert request(world, "ADD", "victim", PODS[1], stdin)[0] == 0
    for nth in (1, 2):
        store.fail_on("release", nth=nth)
        code, out = request(world, "DEL", "victim", PODS[1], stdin)
        assert (code, out["code"]) == (1, 5), out
        assert host_veth_name(NETWORK, "victim", "eth0") not in world.kernel.node.links  # the veth went first
        assert request(world, "DEL", "victim", PODS[1], stdin)[0] == 0  # the runtime retries
        assert store_state(world, store) == before
        assert request(world, "ADD", "victim", PODS[1], stdin)[0] == 0


def test_an_injected_failure_through_the_dispatcher_is_a_spec_error(world):
    stdin = config(world, **MODES["bridge"])
    world.kernel.fail_on("configure_pod")
    code, out = execute(env("ADD", "c1", PODS[2]), stdin, world.handlers)
    error = json.loads(out)
    assert (code, error["code"], error["msg"]) == (1, 100, "netlink request failed")
    assert "injected: configure_pod" in error["details"]


@pytest.mark.parametrize("case", ["routed-ipv6", "bridge-ipv6", "routed-dual-stack"])
def test_an_ipv6_setting_refused_leaves_the_node_as_it_was(world, case):
    """The IPv6 steps' own refusals: the host end's sysctls (IPv6 unavailable: ENOENT), the
    pod side's (inside configure_pod) and the routed host end's gateway address (EACCES)."""
    stdin = config(world, **MODES[case])
    ready(world, stdin)
    before = world.snapshot()
    for operation, error in (("set_link_settings", KernelError(errno.ENOENT, "no net/ipv6/conf")),
                             ("configure_pod", KernelError(errno.ENOENT, "no net/ipv6/conf")),
                             ("route_to_pod", KernelError(errno.EACCES, "IPv6 is disabled on the device"))):
        if operation not in world.kernel.calls:
            continue  # bridge mode has no node routes
        world.kernel.fail_on(operation, error=error, timing=Timing.AFTER)
        code, out = request(world, "ADD", "victim", PODS[1], stdin)
        assert code == 1 and out["code"] == 100 and error.args[-1] in out["details"], (operation, out)
        assert world.snapshot() == before, operation
    assert request(world, "ADD", "victim", PODS[1], stdin)[0] == 0
    assert world.snapshot() != before
    assert request(world, "DEL", "victim", PODS[1], stdin)[0] == 0
    assert world.snapshot() == before
