"""Named network namespaces for the lab, the tests and the benchmarks.

Everything netagent builds for demonstration or testing lives in namespaces created here
(named with a caller's prefix and a random suffix, so parallel runs never collide) and is
removed by the same code, also on failure. Nothing here touches the root namespace.
"""
from __future__ import annotations

import os
import secrets
import subprocess

NETNS_DIR = "/var/run/netns"


def unique_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def netns_path(name: str) -> str:
    return os.path.join(NETNS_DIR, name)


def create(name: str) -> str:
    """Create a namespace with loopback up; return its path."""
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, text=True)
    try:
        run_in(name, ["ip", "link", "set", "lo", "up"], check=True)
    except BaseException:
        remove(name)
        raise
    return netns_path(name)


def remove(name: str) -> None:
    """Delete a namespace and everything inside it; quiet when it is already gone."""
    if os.path.exists(netns_path(name)):
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def run_in(name: str, argv: list, *, check: bool = False, timeout: float = 30,
           input: bytes | str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    text = not isinstance(input, bytes)
    return subprocess.run(["ip", "netns", "exec", name, *argv], capture_output=True, text=text,
                          check=check, timeout=timeout, input=input, env=env)


def exec_prefix(name: str) -> list:
    """argv prefix that runs a program inside the namespace."""
    return ["ip", "netns", "exec", name]
