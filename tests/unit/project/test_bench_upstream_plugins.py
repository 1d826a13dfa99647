"""bench/upstream_plugins.py: the upstream CNI plugins' version comes from bench/peers/go.mod alone,
and cni_latency's records carry it; building them needs Go and the module proxy, so it is left
to the bench (its first run printed `CNI bridge plugin v1.10.0` from the binary it built)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"


@pytest.fixture(scope="module")
def upstream_plugins():
    sys.path.insert(0, str(BENCH))
    try:
        import upstream_plugins
        yield upstream_plugins
    finally:
        sys.path.remove(str(BENCH))


def test_the_pinned_version_is_go_mods(upstream_plugins):
    text = (BENCH / "peers" / "go.mod").read_text()
    version = upstream_plugins.pinned_version()
    assert version.startswith("v1.") and f"{upstream_plugins.MODULE} {version}" in text
    assert upstream_plugins.pinned_version("require (\n\tgithub.com/containernetworking/plugins v1.9.1 // indirect\n)") == "v1.9.1"
    assert upstream_plugins.pinned_version("require github.com/containernetworking/plugins v1.2.0\n") == "v1.2.0"
    with pytest.raises(upstream_plugins.BuildError, match="requires no"):
        upstream_plugins.pinned_version("require github.com/containernetworking/cni v1.3.1\n")
    assert upstream_plugins.plugin_dir(version).endswith(f"build/peers/cni-plugins-{version}")
    for path in upstream_plugins.PLUGINS.values():      # every plugin built is a tool line of go.mod
        assert f"\t{path}\n" in text


def test_a_record_has_the_version_and_ratios_against_debians_pair():
    sys.path.insert(0, str(BENCH))
    try:
        import cni_latency
    finally:
        sys.path.remove(str(BENCH))
    reference = {"add": [0.02, 0.02, 0.02], "del": [0.01] * 3, "burst_add": 1.0, "burst_ok": 3, "burst_unique": 3,
                 "burst_del": 0.5}
    faster = {**reference, "add": [0.01, 0.01, 0.01]}
    found = cni_latency.record("upstream bridge+host-local v1.10.0", faster, version="upstream v1.10.0",
                               family="ipv4", pods=3, reference=reference)
    assert found["mode"].startswith("upstream") and found["version"] == "upstream v1.10.0"
    assert (found["add_median_ms"], found["add_ratio"], found["del_ratio"]) == (10.0, 0.5, 1.0)
