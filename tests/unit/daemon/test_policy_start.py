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


def test_health_turns_unhealthy_when_a_policy_change_waits_too_long():
    from netagent.daemon.policy_start import PolicyParts, with_policy_health
    from netagent.infra.fake_clock import FakeClock
    from netagent.infra.status_server import HealthReport
    from netagent.infra.sync_runner import SyncKind, SyncResult, SyncRunner

    clock = FakeClock()
    outcome = {"result": SyncResult.SUCCEEDED}
    runner = SyncRunner(name="network-policy", sync=lambda kind: outcome["result"], min_interval=0,
                        max_interval=300, retry_interval=5, clock=clock)
    holder: list = []
    health = with_policy_health(lambda: HealthReport(True, "ok", {"runs": 1}), holder, stale_after=60)
    assert health().healthy and "network_policy" not in health().details      # not started yet
    runner.start()
    try:
        holder.append(PolicyParts(engine=None, runner=runner, reflectors=[]))  # type: ignore[arg-type]
        assert runner.run_now_and_wait(30) is SyncResult.SUCCEEDED
        assert health().healthy and health().details["network_policy"]["healthy"]
        outcome["result"] = SyncResult.FAILED
        runner.request(SyncKind.PARTIAL)
        assert runner.wait_settled(30)
        for _ in range(13):
            clock.advance(5.0)
            assert runner.wait_settled(30)
        report = health()
        assert not report.healthy and report.reason.startswith("network policy: ")
        assert report.details["runs"] == 1                                    # the agent's own details stay
    finally:
        runner.stop()


def test_health_lists_unprogrammed_pods_and_the_limit_flags_reach_the_engine():
    from types import SimpleNamespace

    from netagent.daemon.config import parse_run_config
    from netagent.daemon.policy_start import PolicyParts, with_policy_health
    from netagent.infra.rejections import ObjectRef, standalone
    from netagent.infra.status_server import HealthReport
    from netagent.infra.sync_runner import SyncRunner

    scope = standalone("policy")
    scope.reject(ObjectRef("NetworkPolicy", "x", "bad"), reason="too-large", detail="too large (3 rules (limit 2))")
    engine = SimpleNamespace(rejections=scope, unprogrammed=("pod x/a: cannot be rendered",))
    runner = SyncRunner(name="network-policy", sync=lambda kind: None, min_interval=0, max_interval=300,
                        retry_interval=5)
    holder = [PolicyParts(engine=engine, runner=runner, reflectors=[])]  # type: ignore[arg-type]
    section = with_policy_health(lambda: HealthReport(True, "ok", {}), holder, stale_after=60)().details[
        "network_policy"]
    assert "rejected" not in section  # the daemon lists every component's rejections once (rejection_reports.py)
    assert section["unprogrammed"] == ["pod x/a: cannot be rendered"]
    cluster = parse_run_config(build_parser().parse_args([
        "run", "--node-name", "n", "--cluster-cidr", "10.244.0.0/16", "--policy-max-ip-blocks", "5",
        "--policy-max-pairs", "7"])).cluster
    assert cluster is not None
    limits = cluster.policy.limits
    assert (limits.ip_blocks, limits.pairs, limits.rules) == (5, 7, 500)
