"""Pod anti-spoofing's pure parts (netagent/policy/antispoof.py): the rules per attachment and
flavour, the IPAM store read into ports, and the sync writing only what changed; the daemon's
flag (netagent/daemon/policy_start.py). The packets: tests/netns/test_anti_spoofing.py."""
from __future__ import annotations

import argparse
from typing import Any

from netagent.daemon.policy_start import add_policy_arguments
from netagent.kernel.families import IpFamily
from netagent.kernel.nftables.runner import Nft
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.antispoof import AntiSpoofing, PodPort, ports_from_ipam, render_iptables, render_nft

PORTS = [PodPort("na0123456789ab", ("10.244.1.5", "fd00::5")), PodPort("na0123456789ac", ("10.244.1.6",)),
         PodPort("eth0", ("10.244.1.7",)), PodPort('na01" accept', ("10.244.1.8",))]


class RecordingNft(Nft):
    def __init__(self) -> None:
        self.batches: list[str] = []

    def apply(self, batch: str) -> None:
        self.batches.append(batch)

    def list_table(self, family: str, name: str) -> list[dict[str, Any]] | None:
        return None

    def tables(self) -> list[tuple[str, str]]:
        return []


ROUTED_START = """\
add table bridge netagent-antispoof
delete table bridge netagent-antispoof
add table inet netagent-antispoof
delete table inet netagent-antispoof
add table inet netagent-antispoof
add chain inet netagent-antispoof PREROUTING { type filter hook prerouting priority raw; policy accept; }
add rule inet netagent-antispoof PREROUTING iifname != "na*" accept comment "netagent: not from a pod [c48ef6bf]"
"""


def test_routed_is_one_reverse_path_check_with_nothing_per_pod() -> None:
    text = render_nft(PodAttachment.ROUTED, PORTS)
    assert "fib saddr . iif oif missing counter drop" in text
    assert "10.244.1.5" not in text and text.startswith(ROUTED_START)
    for family in IpFamily:
        rules = render_iptables(PodAttachment.ROUTED, family, PORTS)
        assert "-A NETAGENT-ANTISPOOF -i na+ -m rpfilter --invert -j DROP" in rules
        assert rules.index("-i na-+ -j RETURN") < rules.index("rpfilter")   # tunnels, the bridge: not pods
        assert ("fe80::/10 -j RETURN" in rules) == (family is IpFamily.V6)


def test_bridge_mode_binds_each_port_to_its_addresses_and_skips_what_is_not_a_veth() -> None:
    text = render_nft(PodAttachment.BRIDGE, PORTS)
    assert "add table bridge netagent-antispoof\n" in text and "delete table inet netagent-antispoof\n" in text
    assert '"na0123456789ab" . 10.244.1.5' in text and '"na0123456789ab" . fd00::5' in text
    assert '"na0123456789ac" . 10.244.1.6' in text
    assert "eth0" not in text and "accept\"" not in text and "10.244.1.8" not in text
    assert "iifname . ip saddr != @PODS4 counter drop" in text
    assert text.index("fe80::/10 } accept") < text.index("@PODS6")
    v4 = render_iptables(PodAttachment.BRIDGE, IpFamily.V4, PORTS)
    v6 = render_iptables(PodAttachment.BRIDGE, IpFamily.V6, PORTS)
    assert "-m physdev --physdev-in na0123456789ab ! -s 10.244.1.5 -j DROP" in v4
    assert "-m physdev --physdev-in na0123456789ab ! -s fd00::5 -j DROP" in v6
    assert "-m physdev --physdev-in na0123456789ac -j DROP" in v6    # an IPv4-only pod sends no IPv6
    assert "eth0" not in v4 + v6 and "10.244.1.8" not in v4
    assert "-A NETAGENT-ANTISPOOF -m physdev --physdev-in na0+ -j NETAGENT-ANTISPOOF-0" in v4   # buckets by digit
    assert "-A NETAGENT-ANTISPOOF-0 -m physdev --physdev-in na0123456789ab ! -s 10.244.1.5 -j DROP" in v4
    assert ":NETAGENT-ANTISPOOF-f - [0:0]" in v4                  # every bucket flushed, used or not


def test_ports_from_ipam_reads_reservations_and_skips_other_files(tmp_path) -> None:
    (tmp_path / "10.244.1.5").write_text("c1\r\neth0")
    (tmp_path / "fd00::5").write_text("c1\r\neth0")
    (tmp_path / "10.244.1.6").write_text("c2")
    (tmp_path / "last_reserved_ip.0").write_text("10.244.1.6")
    (tmp_path / "lock").write_text("")
    ports = ports_from_ipam(str(tmp_path), lambda container, ifname: f"na-{container}-{ifname}")
    assert ports == [PodPort("na-c1-eth0", ("10.244.1.5", "fd00::5")), PodPort("na-c2-eth0", ("10.244.1.6",))]
    assert ports_from_ipam(str(tmp_path / "absent"), lambda c, i: c) == []


def test_sync_writes_when_the_pods_change_and_reasserts_now_and_then() -> None:
    nft = RecordingNft()
    ports = [PORTS[0]]
    guard = AntiSpoofing(mode=PodAttachment.BRIDGE, ports=lambda: ports, nft=nft, reassert=5)
    guard.sync()
    guard.sync()
    assert len(nft.batches) == 1
    ports = PORTS[:2]
    guard.sync()
    assert len(nft.batches) == 2 and "10.244.1.6" in nft.batches[-1]
    for _ in range(5):
        guard.sync()
    assert len(nft.batches) == 3      # drift repair: the same text again


def test_flag_is_on_by_default() -> None:
    parser = argparse.ArgumentParser()
    add_policy_arguments(parser)
    assert parser.parse_args([]).pod_anti_spoofing == "on"
    assert parser.parse_args(["--pod-anti-spoofing", "off"]).pod_anti_spoofing == "off"


def test_started_parts_ask_their_runner_for_the_first_run() -> None:
    """A SyncRunner runs nothing before a request: the rules must not wait for a policy sync."""
    from netagent.daemon.policy_start import AntiSpoofParts
    from netagent.infra.sync_runner import SyncKind

    class Runner:
        calls: list[str] = []

        def start(self) -> None:
            self.calls.append("start")

        def request(self, kind: SyncKind) -> None:
            self.calls.append(kind.value)

    runner = Runner()
    AntiSpoofParts(runner).start()    # type: ignore[arg-type]
    assert runner.calls == ["start", SyncKind.FULL.value]


def test_the_nft_table_reads_back_and_a_reassert_writes_only_what_drifted() -> None:
    """The table is the nftables model's (`nft_table`): through `FakeNft` it reads back in sync,
    the set each rule uses is a field of the rule, and a reassert writes only when the table
    read back drifted (or the other attachment's table is present)."""
    from netagent.kernel.nftables.fake import FakeNft
    from netagent.policy.antispoof import nft_table

    table = nft_table(PodAttachment.BRIDGE, PORTS)
    assert [rule.sets for rule in table.chains[0].rules if rule.sets] == [("PORTS",), ("PODS4",), ("PODS6",)]
    nft = FakeNft()
    nft.apply("add table inet netagent-antispoof\n")            # left from routed mode
    guard = AntiSpoofing(mode=PodAttachment.BRIDGE, ports=lambda: PORTS, nft=nft, reassert=2)
    assert guard.check()
    guard.sync()
    assert guard.check() == [] and nft.tables() == [("bridge", "netagent-antispoof")]
    guard.sync()                                                  # a reassert, in sync: nothing written
    assert len(nft.batches) == 2
    nft.apply("flush chain bridge netagent-antispoof PREROUTING\n")
    assert guard.check() == ["chain PREROUTING: 0 rule(s) differ from the 7 wanted"]
    guard.sync()
    guard.sync()                                                  # the reassert repairs it
    assert guard.check() == [] and len(nft.batches) == 4
