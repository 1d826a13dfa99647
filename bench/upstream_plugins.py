"""The reference CNI plugins at their latest release, built from the Go module proxy for the
benchmarks (bench/cni_latency.py) beside Debian's older package in /usr/lib/cni.

The version is pinned in one place, bench/peers/go.mod (`github.com/containernetworking/plugins`,
its `tool` lines naming the plugins built); `build()` compiles them with the machine's Go into
build/peers/cni-plugins-<version>/ (static, like upstream's release), and skips the build when
the binaries are newer than go.mod and go.sum. Nothing here is imported by the product.
"""
from __future__ import annotations

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE_DIR = os.path.join(ROOT, "bench", "peers")
MODULE = "github.com/containernetworking/plugins"
PLUGINS = {"bridge": f"{MODULE}/plugins/main/bridge", "host-local": f"{MODULE}/plugins/ipam/host-local"}


class BuildError(RuntimeError):
    """The plugins could not be built (no Go, the module proxy unreachable, a compile error)."""


def pinned_version(go_mod: str | None = None) -> str:
    """The plugins' version bench/peers/go.mod requires."""
    text = go_mod if go_mod is not None else open(os.path.join(MODULE_DIR, "go.mod")).read()
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(MODULE)}\s+(v[0-9][^\s]*)", text, re.MULTILINE)
    if found is None:
        raise BuildError(f"bench/peers/go.mod requires no {MODULE}")
    return found.group(1)


def plugin_dir(version: str) -> str:
    return os.path.join(ROOT, "build", "peers", f"cni-plugins-{version}")


def _fresh(directory: str) -> bool:
    sources = max(os.path.getmtime(os.path.join(MODULE_DIR, name)) for name in ("go.mod", "go.sum"))
    binaries = [os.path.join(directory, name) for name in PLUGINS]
    return all(os.path.exists(path) and os.path.getmtime(path) > sources for path in binaries)


def build(*, timeout: float = 900.0) -> tuple[str, str]:
    """(directory holding `bridge` and `host-local`, their version), built when stale."""
    version = pinned_version()
    directory = plugin_dir(version)
    if _fresh(directory):
        return directory, version
    os.makedirs(directory, exist_ok=True)
    flags = f"-X {MODULE}/pkg/utils/buildversion.BuildVersion={version}"
    argv = ["go", "build", "-trimpath", "-ldflags", flags, "-o", directory + os.sep, *PLUGINS.values()]
    try:
        proc = subprocess.run(argv, cwd=MODULE_DIR, env={**os.environ, "CGO_ENABLED": "0"},
                              capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BuildError(f"go build of the CNI plugins {version} did not run: {error}") from None
    if proc.returncode != 0:
        raise BuildError(f"go build of the CNI plugins {version} failed: {proc.stderr.strip()[-600:]}")
    return directory, version
