"""`netagent run --network-policy`'s pieces that need no root: the flag, and finding a pod's
host interface from the CNI plugin's IPAM reservation (as the plugin names it)."""
from __future__ import annotations

from cni.ipam.store import DiskStore, owner_text
from cni.wiring import host_veth_name
from netagent.cli import build_parser
from netagent.daemon.policy_start import ipam_interface_lookup
from netagent.policy.semantics import PodPlan


def test_interface_comes_from_the_reservation_of_the_pod_address(tmp_path):
    store = DiskStore(str(tmp_path / "netagent"))
    store.open_lock_file()
    assert store.reserve("10.244.1.7", owner=owner_text("abc123", "eth0"))
    lookup = ipam_interface_lookup(str(tmp_path), "netagent")
    plan = PodPlan("x/a", "10.244.1.7", (), None)
    assert lookup(plan) == host_veth_name("netagent", "abc123", "eth0")
    assert lookup(PodPlan("x/b", "10.244.1.8", (), None)) is None


def test_the_flag_is_off_unless_given():
    parser = build_parser()
    base = ["run", "--node-name", "n", "--cluster-cidr", "10.244.0.0/16"]
    assert parser.parse_args(base).network_policy is False
    assert parser.parse_args([*base, "--network-policy"]).network_policy is True
