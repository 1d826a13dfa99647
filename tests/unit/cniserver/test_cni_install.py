"""`netagent cni install` puts the static shim in place as `netagent` and `netagent-ipam`, never a script.

The shim is built into a temporary directory with its own build script and handed over as
a prebuilt binary (`--shim`), the way an image would ship it; the default build location is
exercised by the netns and e2e tiers. Without a shim nothing is written.
"""
from __future__ import annotations

import json
import os
import stat

import pytest

from netagent.cli import main as cli_main
from netagent.cniserver import install as cni_install
from netagent.kernel.pod_attachment import PodAttachment
from tests.shim_support import build_shim_or_skip


def test_install_copies_the_shim_as_netagent_and_netagent_ipam(tmp_path):
    shim = build_shim_or_skip(tmp_path / "build")
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    assert cli_main(["cni", "install", "--bin-dir", str(bin_dir), "--conf-dir", str(conf_dir),
                     "--subnet", "10.244.1.0/24", "--shim", shim]) == 0
    for binary in ("netagent", "netagent-ipam"):  # the same program; its argv[0] tells which plugin
        installed = (bin_dir / binary).read_bytes()
        assert installed == open(shim, "rb").read() and installed[:4] == b"\x7fELF"
        assert stat.S_IMODE(os.stat(bin_dir / binary).st_mode) == 0o755
    assert (conf_dir / cni_install.CONFLIST_NAME).exists()
    assert sorted(os.listdir(bin_dir)) == ["netagent", "netagent-ipam"]  # no temporary left


def test_without_a_shim_nothing_is_written(tmp_path, capsys):
    bin_dir = tmp_path / "bin"
    assert cli_main(["cni", "install", "--bin-dir", str(bin_dir), "--shim", str(tmp_path / "missing")]) == 1
    assert "not an executable shim" in capsys.readouterr().err
    assert not bin_dir.exists()


def test_a_failing_build_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    with pytest.raises(cni_install.ShimUnavailable, match="building the CNI shim failed"):
        cni_install.build_shim(str(tmp_path / "netagent"))
    assert not (tmp_path / "netagent").exists()


def test_the_shim_is_stale_when_any_of_its_sources_is_newer():
    """Every .c and .h of cni/shim/ (and build.sh) counts, so no file of the split shim can leave a
    stale binary; the fuzz harness beside them is not part of the shim."""
    directory = cni_install.shim_source_dir()
    expected = sorted(name for name in os.listdir(directory) if name.endswith((".c", ".h")))
    names = [os.path.basename(source) for source in cni_install.shim_sources()]
    assert names == sorted([*expected, "build.sh"]) and "netagent-shim.c" in names
    assert all(os.path.dirname(source) == directory for source in cni_install.shim_sources())


@pytest.mark.parametrize("touched", ["wire.h", "journal.c", "build.sh", "fuzz/fuzz_shim.c"])
def test_a_touched_source_rebuilds_the_shim_and_only_a_source_does(tmp_path, monkeypatch, touched):
    source = tmp_path / "cni" / "shim"
    (source / "fuzz").mkdir(parents=True)
    for name in ("build.sh", "netagent-shim.c", "journal.c", "wire.h", "fuzz/fuzz_shim.c"):
        (source / name).write_text("")
    built = tmp_path / "build" / "netagent"
    built.parent.mkdir()
    built.write_bytes(b"\x7fELF")
    built.chmod(0o755)
    for path in [*source.rglob("*"), built]:
        os.utime(path, (1000, 1000))
    os.utime(source / touched, (2000, 2000))
    builds = []
    monkeypatch.setattr(cni_install, "shim_source_dir", lambda: str(source))
    monkeypatch.setattr(cni_install, "default_shim_path", lambda: str(built))
    monkeypatch.setattr(cni_install, "build_shim", lambda output: builds.append(output) or output)
    assert cni_install.shim_binary() == str(built)
    assert builds == ([] if touched.startswith("fuzz/") else [str(built)])


def test_the_python_client_is_installed_only_when_asked_for(tmp_path):
    paths = cni_install.install(bin_dir=str(tmp_path), conf_dir=None, name="n", subnets=[], mode=PodAttachment.BRIDGE,
                                bridge="na0", mtu=1500, socket_path="/run/x.sock", data_dir="/tmp",
                                plugin=cni_install.PluginBinary.PYTHON)
    assert [os.path.basename(p) for p in paths] == ["netagent", "netagent-ipam"]
    assert (tmp_path / "netagent").read_text().splitlines()[0].endswith(" -IS")


def test_portmap_is_chained_after_netagent_when_asked(tmp_path):
    plain = cni_install.render_conflist(name="n", subnets=["10.244.1.0/24"], mode=PodAttachment.BRIDGE, bridge="na0",
                                    mtu=1450, socket_path="/s", data_dir="/d")
    assert [p["type"] for p in plain["plugins"]] == ["netagent"]
    chained = cni_install.render_conflist(name="n", subnets=["10.244.1.0/24"], mode=PodAttachment.BRIDGE, bridge="na0",
                                      mtu=1450, socket_path="/s", data_dir="/d", portmap=True)
    assert [p["type"] for p in chained["plugins"]] == ["netagent", "portmap"]
    assert chained["plugins"][1]["capabilities"] == {"portMappings": True}


@pytest.mark.parametrize("setting,present,chained", [("auto", True, True), ("auto", False, False),
                                                     ("on", False, True), ("off", True, False)])
def test_the_agent_chains_portmap_where_the_node_has_it(tmp_path, setting, present, chained):
    import ipaddress

    from netagent.daemon.config import CniConfig
    from netagent.daemon.run import _cni_config_writer
    from netagent.noderoutes.host import Lease
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if present:
        (bin_dir / "portmap").write_text("#!/bin/sh\n")
        (bin_dir / "portmap").chmod(0o755)
    cni = CniConfig(socket="/run/netagent/cni.sock", workers=1, conf_dir=str(tmp_path / "net.d"),
                    attachment=PodAttachment.BRIDGE, portmap={"auto": None, "on": True, "off": False}[setting],
                    bin_dir=str(bin_dir), data_dir="/var/lib/cni")
    _cni_config_writer(cni)(Lease(node_name="node-1", pod_cidrs=(ipaddress.ip_network("10.244.1.0/24"),), mtu=1450))
    written = json.loads((tmp_path / "net.d" / cni_install.CONFLIST_NAME).read_text())
    assert ("portmap" in [p["type"] for p in written["plugins"]]) is chained
