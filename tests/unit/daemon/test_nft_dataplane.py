"""Choosing the dataplane (`daemon/dataplane.py`): nftables by itself where iptables cannot
work, the flag otherwise, a clear error where the flag asks for what cannot work. The probes
run with fake readers; `netagent run`'s parser leaves `--proxy-mode` unset when not given."""
from __future__ import annotations

import argparse

import pytest

from netagent.daemon.config import proxy_mode
from netagent.daemon.dataplane import (
    DataplaneError,
    Dataplane,
    Netfilter,
    choose_proxy_mode,
    iptables_usable,
    kernel_has_xtables,
)
from netagent.daemon.run import add_run_arguments
from proxy.backend import ProxyMode

WORKS = (True, "fine")
NO_IPTABLES = (False, "no iptables binaries (iptables-legacy-restore, ... not found)")
NO_NFT = (False, "the libnftables Python bindings (python3-nftables) are missing")


def test_not_given_is_iptables_where_it_works():
    assert choose_proxy_mode(None, iptables=WORKS, nftables=WORKS)[0] is ProxyMode.IPTABLES


def test_not_given_is_nftables_where_iptables_cannot_work_and_says_why():
    mode, reason = choose_proxy_mode(None, iptables=NO_IPTABLES, nftables=WORKS)
    assert mode is ProxyMode.NFTABLES and "iptables cannot work here" in reason and "no iptables binaries" in reason


@pytest.mark.parametrize("requested", ["iptables", "ipvs", "ebpf", "none"])
def test_a_mode_needing_iptables_where_it_cannot_work_is_a_clear_error(requested):
    with pytest.raises(DataplaneError, match=f"--proxy-mode {requested} needs iptables.*nftables works here"):
        choose_proxy_mode(proxy_mode(requested), iptables=NO_IPTABLES, nftables=WORKS)


def test_nftables_asked_for_where_it_cannot_work():
    with pytest.raises(DataplaneError, match="python3-nftables"):
        choose_proxy_mode(ProxyMode.NFTABLES, iptables=WORKS, nftables=NO_NFT)
    with pytest.raises(DataplaneError, match="neither iptables"):
        choose_proxy_mode(None, iptables=NO_IPTABLES, nftables=NO_NFT)


def test_the_flag_decides_where_both_work():
    assert choose_proxy_mode(ProxyMode.NFTABLES, iptables=WORKS, nftables=WORKS)[0] is ProxyMode.NFTABLES
    assert choose_proxy_mode(ProxyMode.IPVS, iptables=WORKS, nftables=NO_NFT)[0] is ProxyMode.IPVS
    assert choose_proxy_mode(proxy_mode("none"), iptables=WORKS, nftables=NO_NFT)[0] is proxy_mode("none")


@pytest.mark.parametrize("mode, netfilter, proxy", [
    (ProxyMode.NFTABLES, Netfilter.NFTABLES, ProxyMode.NFTABLES), (ProxyMode.IPVS, Netfilter.IPTABLES, ProxyMode.IPVS),
    (proxy_mode("none"), Netfilter.IPTABLES, None)])
def test_the_dataplane_names_its_netfilter_and_its_proxy(mode, netfilter, proxy):
    dataplane = Dataplane(proxy_mode=mode, reason="", iptables=True)
    assert (dataplane.netfilter, dataplane.proxy, dataplane.nftables) == (
        netfilter, proxy, netfilter is Netfilter.NFTABLES)


def test_iptables_usable_needs_binaries_and_xtables():
    assert iptables_usable(missing=lambda: [["iptables-legacy-restore"], ["iptables-nft-restore"]],
                           xtables=lambda: WORKS) == (False, "no iptables binaries "
                                                      "(iptables-legacy-restore, iptables-nft-restore not found)")
    assert iptables_usable(missing=lambda: [["iptables-legacy-restore"], []],
                           xtables=lambda: (False, "no xtables")) == (False, "no xtables")
    assert iptables_usable(missing=lambda: [["iptables-legacy-restore"], []], xtables=lambda: WORKS)[0]


def test_xtables_from_proc_or_the_module_lists():
    files = {"/lib/modules/6.1.0/modules.dep": "kernel/net/netfilter/x_tables.ko:\n"
                                               "kernel/net/ipv4/netfilter/ip_tables.ko: x_tables.ko\n"}
    assert kernel_has_xtables(release="6.1.0", exists=lambda path: False, read=files.get)[0]
    assert kernel_has_xtables(release="6.1.0", exists=lambda path: path == "/proc/net/ip_tables_names",
                              read=lambda path: None)[0]
    found, why = kernel_has_xtables(release="6.12.0", exists=lambda path: False, read=files.get)
    assert not found and "no xtables" in why


def test_run_leaves_the_proxy_mode_unset_when_not_given():
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    assert parser.parse_args([]).proxy_mode is None
    assert parser.parse_args(["--proxy-mode", "nftables"]).proxy_mode == "nftables"
