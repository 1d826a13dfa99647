"""netagent/daemon/proxy_start.py's `start_ebpf_flows`: nothing outside eBPF mode, and in eBPF mode
a ring buffer that cannot be opened leaves the proxy running without eBPF flows (logged), never
stopping the agent. (The listener on real pins: tests/netns/test_ebpf_flows.py.)"""
from __future__ import annotations

import logging
from types import SimpleNamespace

from ebpf.fake_maps import fake_map_set
from netagent.daemon.proxy_start import start_ebpf_flows
from netagent.infra.flows import FlowRing
from proxy.ebpf.backend import EbpfPaths, EbpfProxy


def parts_with(backend) -> SimpleNamespace:
    return SimpleNamespace(proxy=SimpleNamespace(backend=backend))


def policy_flows() -> SimpleNamespace:
    return SimpleNamespace(ring=FlowRing(size=16), names=SimpleNamespace(pod=lambda address: ""))


def test_no_proxy_or_another_mode_starts_nothing():
    assert start_ebpf_flows(None, policy_flows())() is None
    assert start_ebpf_flows(parts_with(object()), policy_flows())() is None   # type: ignore[arg-type]


def test_unreadable_pins_leave_flows_off_with_a_warning(tmp_path, caplog):
    backend = EbpfProxy(maps=fake_map_set(), paths=EbpfPaths(bpf_root=str(tmp_path), cgroup="/c"))
    with caplog.at_level(logging.WARNING):
        stop = start_ebpf_flows(parts_with(backend), policy_flows())   # type: ignore[arg-type]
    assert stop() is None
    assert "eBPF flow records off" in caplog.text
    with caplog.at_level(logging.WARNING):   # flows off: turning the events off fails the same quiet way
        start_ebpf_flows(parts_with(backend), None)()   # type: ignore[arg-type]
