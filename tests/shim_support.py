"""Helpers shared by the CNI shim's tests: build it with its own build script, run it.

The shim is the one compiled piece of the project; its tests skip (with the reason) only
when this machine has no C compiler at all, and fail when a compiler exists but the build
breaks.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from netagent.cniserver import install as cni_install


def build_shim_or_skip(directory, *, default_socket: str | None = None) -> str:
    """Build the shim into `directory` with cni/shim/build.sh; return the binary's path.

    The shim a config without `agentSocket` sends to is `default_socket`, by default
    `<directory>/no-agent/cni.sock` (nothing listens there): a test's shim never reaches, nor
    journals a DEL under, the host's real /run/netagent. Only the shim `netagent cni install`
    copies (`installed_shim_or_skip`) keeps the production default."""
    if not (os.environ.get("CC") or shutil.which("musl-gcc") or shutil.which("gcc")):
        pytest.skip("no C compiler (musl-gcc or gcc) to build the CNI shim: apt-get install musl-tools")
    output = os.path.join(str(directory), "netagent")
    default_socket = default_socket or os.path.join(str(directory), "no-agent", "cni.sock")
    proc = subprocess.run(["sh", os.path.join(cni_install.shim_source_dir(), "build.sh"), output],
                          env={**os.environ, "NETAGENT_DEFAULT_SOCKET": default_socket},
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"building the CNI shim failed:\n{proc.stderr}"
    return output


def installed_shim_or_skip() -> str:
    """The shim `netagent cni install` copies (build/cni-shim/netagent, built if stale)."""
    try:
        return cni_install.shim_binary()
    except cni_install.ShimUnavailable as exc:
        if "no C compiler" in str(exc):
            pytest.skip(str(exc))
        raise


def run_binary(binary: str, env: dict, stdin: bytes, *, timeout: float = 30.0,
               prefix: list | None = None) -> subprocess.CompletedProcess:
    """Execute a CNI plugin binary as a runtime does: this environment only, config on stdin."""
    return subprocess.run([*(prefix or []), binary], input=stdin, env=env, capture_output=True,
                          timeout=timeout)
