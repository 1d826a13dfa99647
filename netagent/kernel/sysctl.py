"""Kernel settings (sysctls): each wanted value with its reason, read first and written only
when it differs, so a restarted agent writes nothing.

Sysctls are per network namespace. They are set only in the namespace the agent serves: the
node's (where the agent runs), or a test's node namespace through `exec_prefix`, never a
machine's root namespace from a test. Cleanup leaves them in place: other software may rely
on them, and their defaults are not ours to know. `IP_FORWARD` is here because the node
agent, the CNI plugin and the IPVS backend all need it.
"""
from __future__ import annotations

import abc
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from netagent.kernel.families import IpFamily


@dataclass(frozen=True)
class Sysctl:
    key: str        # dotted, as `sysctl` spells it
    value: str
    why: str


class Sysctls(abc.ABC):
    @abc.abstractmethod
    def read(self, key: str) -> str | None:
        """The current value, or None when the key does not exist."""

    @abc.abstractmethod
    def write(self, key: str, value: str) -> None: ...

    def read_many(self, keys: Iterable[str]) -> dict[str, str | None]:
        return {key: self.read(key) for key in keys}


def ensure_sysctls(sysctls: Sysctls, wanted: Iterable[Sysctl]) -> list[str]:
    """Set what differs; returns `key=value` for each write. A missing key is an error naming
    it (for the IPVS ones: the ip_vs module is not loaded)."""
    wanted = list(wanted)
    values = sysctls.read_many(setting.key for setting in wanted)
    written = []
    for setting in wanted:
        current = values.get(setting.key)
        if current is None:
            raise LookupError(f"sysctl {setting.key} does not exist (is the module loaded?)")
        if current.split() != setting.value.split():
            sysctls.write(setting.key, setting.value)
            written.append(f"{setting.key}={setting.value}")
    return written


class ProcSysctls(Sysctls):
    """Reads and writes /proc/sys of the calling process's network namespace, or, with an
    `exec_prefix` (`ip netns exec NAME`), runs `sysctl` there."""

    def __init__(self, *, exec_prefix: Sequence[str] = (), root: Path = Path("/proc/sys")):
        self.exec_prefix = list(exec_prefix)
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / key.replace(".", "/")

    def read(self, key: str) -> str | None:
        if not self.exec_prefix:
            try:
                return self._path(key).read_text().strip()
            except FileNotFoundError:
                return None
        done = subprocess.run([*self.exec_prefix, "sysctl", "-n", key], capture_output=True, text=True,
                              timeout=30)
        return done.stdout.strip() if done.returncode == 0 else None

    def read_many(self, keys: Iterable[str]) -> dict[str, str | None]:
        keys = list(keys)
        if not self.exec_prefix:
            return super().read_many(keys)
        # one exec for all: `sysctl` prints "key = value" for each key it has, complains about the others
        done = subprocess.run([*self.exec_prefix, "sysctl", *keys], capture_output=True, text=True, timeout=30)
        found = dict(line.split(" = ", 1) for line in done.stdout.splitlines() if " = " in line)
        return {key: found[key].strip() if key in found else None for key in keys}

    def write(self, key: str, value: str) -> None:
        if not self.exec_prefix:
            self._path(key).write_text(value)
            return
        subprocess.run([*self.exec_prefix, "sysctl", "-q", "-w", f"{key}={value}"], check=True,
                       capture_output=True, text=True, timeout=30)


IP_FORWARD = Sysctl("net.ipv4.ip_forward", "1",
                    "pods' traffic is routed through the node, and replies from endpoints to clients "
                    "outside the node are forwarded")
IPV6_FORWARD = Sysctl("net.ipv6.conf.all.forwarding", "1", "the same for IPv6 pods")


def forwarding(family: IpFamily) -> Sysctl:
    """The forwarding sysctl of an IP family."""
    return IP_FORWARD if family is IpFamily.V4 else IPV6_FORWARD
