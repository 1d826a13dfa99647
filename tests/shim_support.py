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


def build_shim_or_skip(directory) -> str:
    """Build the shim into `directory` with cni/shim/build.sh; return the binary's path."""
    if not (os.environ.get("CC") or shutil.which("musl-gcc") or shutil.which("gcc")):
        pytest.skip("no C compiler (musl-gcc or gcc) to build the CNI shim: apt-get install musl-tools")
    return cni_install.build_shim(os.path.join(str(directory), "netagent"))


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
