"""BIRD configuration: the typed model refuses bad values, the renderer's text is pinned by goldens,
and BIRD itself parses every golden and every hostile-but-accepted rendering (`bird -p`).

Update the goldens with
`UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/noderoutes/bgp/test_bgp_config.py -q` and review
`git diff tests/unit/golden/bgp/`.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netagent.noderoutes.bgp.bird_config import quote, render_bird_config
from netagent.noderoutes.bgp.model import (
    Bfd,
    BgpConfigError,
    BgpNodeConfig,
    BgpPeer,
    GracefulRestart,
    PeerRole,
    Timers,
    check_as_number,
)

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden" / "bgp"
BIRD = shutil.which("bird")
A, N = ip_address, ip_network
FAST = Timers(hold=3, keepalive=1, connect_retry=1)


def mesh_node() -> BgpNodeConfig:
    return BgpNodeConfig(
        router_id=A("192.168.0.11"), local_address=A("192.168.0.11"), asn=64512,
        own_cidrs=(N("10.244.1.0/24"),), timers=FAST,
        peers=tuple(BgpPeer(A(f"192.168.0.{i}"), 64512, PeerRole.MESH, accept=(N(f"10.244.{i - 10}.0/24"),))
                    for i in (12, 13, 14)))


def reflector_node() -> BgpNodeConfig:
    clients = tuple(BgpPeer(A(f"192.168.0.{i}"), 64512, PeerRole.REFLECTOR_CLIENT,
                            accept=(N(f"10.244.{i - 10}.0/24"),)) for i in (13, 14))
    fellow = BgpPeer(A("192.168.0.12"), 64512, PeerRole.REFLECTOR, accept=(N("10.244.2.0/24"),))
    return BgpNodeConfig(
        router_id=A("192.168.0.11"), local_address=A("192.168.0.11"), asn=64512,
        own_cidrs=(N("10.244.1.0/24"),), peers=clients + (fellow,), rr_cluster_id=A("192.168.0.11"),
        reflected=(N("10.244.2.0/24"), N("10.244.3.0/24"), N("10.244.4.0/24")), timers=FAST)


def client_node() -> BgpNodeConfig:
    every = (N("10.244.1.0/24"), N("10.244.2.0/24"), N("10.244.4.0/24"))
    return BgpNodeConfig(
        router_id=A("192.168.0.13"), local_address=A("192.168.0.13"), asn=64512,
        own_cidrs=(N("10.244.3.0/24"),), timers=FAST,
        peers=(BgpPeer(A("192.168.0.11"), 64512, PeerRole.REFLECTOR, accept=every),
               BgpPeer(A("192.168.0.12"), 64512, PeerRole.REFLECTOR, accept=every)))


def tor_node() -> BgpNodeConfig:
    return BgpNodeConfig(
        router_id=A("192.168.1.21"), local_address=A("192.168.1.21"), asn=64512,
        own_cidrs=(N("10.244.5.0/24"),),
        graceful_restart=GracefulRestart(restart_time=30, wait=60), bfd=Bfd(min_rx_ms=50, min_tx_ms=50),
        peers=(BgpPeer(A("192.168.1.1"), 65001, PeerRole.EXTERNAL, password="top-of-rack key",
                       accept=(N("10.244.1.0/24"), N("10.244.3.0/24")), bfd=True),
               BgpPeer(A("172.16.0.1"), 65002, PeerRole.EXTERNAL, multihop=4, accept=())))


def no_restart_node() -> BgpNodeConfig:
    return BgpNodeConfig(router_id=A("10.1.0.1"), local_address=A("10.1.0.1"), asn=4200000000,
                         own_cidrs=(N("10.244.9.0/24"), N("fd00:9::/64")),
                         graceful_restart=GracefulRestart(enabled=False),
                         peers=(BgpPeer(A("10.1.0.2"), 4200000000, PeerRole.MESH,
                                        accept=(N("10.244.8.0/24"), N("fd00:8::/64"))),))


CASES = {"mesh": mesh_node, "reflector": reflector_node, "client": client_node, "tor": tor_node,
         "no-restart-dual-stack": no_restart_node}


def bird_parses(text: str) -> tuple:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bird.conf"
        path.write_text(text)
        done = subprocess.run([BIRD, "-p", "-c", str(path)], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr + done.stdout


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case):
    text = render_bird_config(CASES[case]())
    path = GOLDEN_DIR / f"{case}.conf"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text()


@pytest.mark.skipif(BIRD is None, reason="bird (bird2) is not installed")
@pytest.mark.parametrize("case", sorted(CASES))
def test_bird_parses_every_golden(case):
    code, output = bird_parses((GOLDEN_DIR / f"{case}.conf").read_text())
    assert code == 0, output


def test_render_is_deterministic_and_sorted():
    config = mesh_node()
    shuffled = BgpNodeConfig(**{**config.__dict__, "peers": tuple(reversed(config.peers))})
    assert render_bird_config(config) == render_bird_config(shuffled)


def test_import_filters_accept_exactly_the_given_prefixes_and_reject_the_rest():
    text = render_bird_config(tor_node())
    assert "filter import4_peer4_192_168_1_1 {\n  if net ~ [ 10.244.1.0/24, 10.244.3.0/24 ] then accept;\n" \
           "  reject;\n}" in text
    assert "filter import4_peer4_172_16_0_1 {\n  reject;\n}" in text  # nothing admitted: nothing accepted
    assert "accept all" not in text and "import all" not in text.replace("import all; export none", "")


def test_reflector_reflects_only_to_clients():
    text = render_bird_config(reflector_node())
    client = text.split("protocol bgp peer4_192_168_0_13 {")[1].split("\n}")[0]
    fellow = text.split("protocol bgp peer4_192_168_0_12 {")[1].split("\n}")[0]
    assert "rr client;" in client and "export filter export4_reflected;" in client
    assert "rr client;" not in fellow and "export filter export4_own;" in fellow


@pytest.mark.parametrize("value", [0, -1, 4294967296, True, "64512", 1.5, None])
def test_bad_as_numbers_are_refused(value):
    with pytest.raises(BgpConfigError):
        check_as_number(value)


@pytest.mark.parametrize("password", ['a"b', "a\\b", "a\nb", "a\x00b", "", "x" * 81, "caf\u00e9", "\x7f"])
def test_passwords_bird_cannot_carry_are_refused(password):
    with pytest.raises(BgpConfigError):
        BgpPeer(A("10.0.0.2"), 64512, PeerRole.EXTERNAL, password=password)
    with pytest.raises(BgpConfigError):
        quote(password)


@pytest.mark.parametrize("build", [
    lambda: Timers(hold=2), lambda: Timers(hold=9, keepalive=9), lambda: GracefulRestart(restart_time=4096),
    lambda: Bfd(multiplier=0), lambda: BgpPeer(A("0.0.0.0"), 1, PeerRole.MESH),
    lambda: BgpPeer(A("127.0.0.1"), 1, PeerRole.MESH), lambda: BgpPeer(A("10.0.0.2"), 1, "mesh"),
    lambda: BgpPeer("10.0.0.2", 1, PeerRole.MESH), lambda: BgpPeer(A("10.0.0.2"), 1, PeerRole.MESH, multihop=1),
    lambda: BgpPeer(A("10.0.0.2"), 1, PeerRole.MESH, accept=("10.244.0.0/24",)),
    lambda: BgpNodeConfig(router_id=A("0.0.0.0"), local_address=A("10.0.0.1"), asn=1, own_cidrs=()),
    lambda: BgpNodeConfig(router_id=A("10.0.0.1"), local_address=A("10.0.0.1"), asn=1, own_cidrs=(),
                          kernel_table=254),
    lambda: BgpNodeConfig(router_id=A("10.0.0.1"), local_address=A("10.0.0.1"), asn=1, own_cidrs=(),
                          peers=(BgpPeer(A("10.0.0.1"), 1, PeerRole.MESH),)),
    lambda: BgpNodeConfig(router_id=A("10.0.0.1"), local_address=A("10.0.0.1"), asn=1, own_cidrs=(),
                          peers=(BgpPeer(A("10.0.0.2"), 1, PeerRole.REFLECTOR_CLIENT),)),
])
def test_invalid_values_are_refused_where_they_are_built(build):
    with pytest.raises(BgpConfigError):
        build()


addresses = st.one_of(st.integers(1, 2**32 - 1).map(IPv4Address), st.integers(1, 2**128 - 1).map(IPv6Address))


@pytest.mark.skipif(BIRD is None, reason="bird (bird2) is not installed")
@settings(max_examples=int(os.environ.get("NETAGENT_FUZZ_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(password=st.text(min_size=0, max_size=100), address=addresses,
       asn=st.integers(-2, 2**32 + 2), as_peer=st.integers(1, 2**32 - 1))
def test_hostile_values_render_safely_or_are_refused(password, address, asn, as_peer):
    """Any password, address or AS number either is refused with `BgpConfigError` or renders into
    a file BIRD parses, with the password carried verbatim inside one string literal."""
    try:
        peer = BgpPeer(address, as_peer, PeerRole.EXTERNAL, password=password, accept=(N("10.244.2.0/24"),))
        config = BgpNodeConfig(router_id=A("10.0.0.1"), local_address=A("10.0.0.1"), asn=asn,
                               own_cidrs=(N("10.244.1.0/24"),), peers=(peer,))
    except BgpConfigError:
        return
    text = render_bird_config(config)
    assert f'  password "{password}";\n' in text
    assert text.count('"') == 2 + text.count('proto = "static4"') * 2 + text.count('interface "*"') * 2
    code, output = bird_parses(text)
    assert code == 0, output
