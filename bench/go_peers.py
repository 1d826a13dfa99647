"""The real peers the benchmarks run beside netagent that are Go programs: the reference CNI
plugins at their latest release (bench/cni_latency.py, beside Debian's older package in
/usr/lib/cni) and flannel's flanneld (bench/pod_throughput.py), built from the Go module proxy.

Each peer is one Go module under bench/peers/ whose go.mod pins its version (the one place) and
names what is built in its `tool` lines; `build(peer)` compiles those with the machine's Go into
build/peers/<name>-<version>/ (static unless the peer needs cgo), and skips the build when the binaries are newer than
go.mod and go.sum. Nothing here is imported by the product.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BuildError(RuntimeError):
    """A peer could not be built (no Go, the module proxy unreachable, a compile error)."""


@dataclass(frozen=True)
class GoPeer:
    name: str                      # the build directory's name
    module: str                    # the module whose version go.mod pins
    binaries: dict[str, str]       # binary name -> package built into it
    version_variable: str = ""     # a string variable the release build sets to the version
    cgo: bool = False              # built with cgo (flannel's udp backend needs it), else static

    @property
    def module_dir(self) -> str:
        return os.path.join(ROOT, "bench", "peers", self.name)


CNI_PLUGINS = GoPeer("cni-plugins", "github.com/containernetworking/plugins",
                     {"bridge": "github.com/containernetworking/plugins/plugins/main/bridge",
                      "host-local": "github.com/containernetworking/plugins/plugins/ipam/host-local"},
                     "github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion")
FLANNEL = GoPeer("flannel", "github.com/flannel-io/flannel", {"flanneld": "github.com/flannel-io/flannel"},
                 "github.com/flannel-io/flannel/pkg/version.Version", cgo=True)


def pinned_version(peer: GoPeer, go_mod: str | None = None) -> str:
    """The version of `peer.module` its go.mod requires."""
    text = go_mod if go_mod is not None else open(os.path.join(peer.module_dir, "go.mod")).read()
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(peer.module)}\s+(v[0-9][^\s]*)", text, re.MULTILINE)
    if found is None:
        raise BuildError(f"bench/peers/{peer.name}/go.mod requires no {peer.module}")
    return found.group(1)


def build_dir(peer: GoPeer, version: str) -> str:
    return os.path.join(ROOT, "build", "peers", f"{peer.name}-{version}")


def _fresh(peer: GoPeer, directory: str) -> bool:
    sources = max(os.path.getmtime(os.path.join(peer.module_dir, name)) for name in ("go.mod", "go.sum"))
    binaries = [os.path.join(directory, name) for name in peer.binaries]
    return all(os.path.exists(path) and os.path.getmtime(path) > sources for path in binaries)


def build(peer: GoPeer, *, timeout: float = 1200.0) -> tuple[str, str]:
    """(directory holding `peer`'s binaries, their version), built when stale."""
    version = pinned_version(peer)
    directory = build_dir(peer, version)
    if _fresh(peer, directory):
        return directory, version
    os.makedirs(directory, exist_ok=True)
    flags = f"-X {peer.version_variable}={version}" if peer.version_variable else ""
    for binary, package in peer.binaries.items():
        argv = ["go", "build", "-trimpath", "-ldflags", flags, "-o", os.path.join(directory, binary), package]
        try:
            proc = subprocess.run(argv, cwd=peer.module_dir, env={**os.environ, "CGO_ENABLED": "1" if peer.cgo else "0"},
                                  capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise BuildError(f"go build of {peer.name} {version} did not run: {error}") from None
        if proc.returncode != 0:
            raise BuildError(f"go build of {peer.name} {version} failed: {proc.stderr.strip()[-600:]}")
    return directory, version
