"""Kernel settings the IPVS backend needs, each with the reason, and the code that sets them.

They are per network namespace and set only in the namespace the backend serves: the node's
(the agent runs there), or the test's node namespace through `exec_prefix`. Never on a
machine's root namespace from a test. `ensure_sysctls` reads first and writes only what
differs, so a restarted agent writes nothing. They are left in place by cleanup: other
software may rely on them, and their defaults are not ours to know.

The IPVS ones exist only once the ip_vs module is loaded (it creates them per namespace).
"""
from __future__ import annotations

import abc
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Sysctl:
    key: str        # dotted, as `sysctl` spells it
    value: str
    why: str


IPVS_SYSCTLS: tuple[Sysctl, ...] = (
    Sysctl("net.ipv4.vs.conntrack", "1",
           "IPVS keeps netfilter conntrack entries for the connections it forwards; without it "
           "the MASQUERADE in nat POSTROUTING never sees them (off-cluster clients of a cluster "
           "IP, NodePort and external traffic under policy Cluster, hairpin), and replies of "
           "masqueraded connections find no way back"),
    Sysctl("net.ipv4.vs.expire_nodest_conn", "1",
           "a connection whose real server was deleted is expired on its next packet instead of "
           "being dropped until its timeout: a UDP client that keeps sending moves on to a live "
           "endpoint right away, a TCP client gets an error instead of a hang"),
    Sysctl("net.ipv4.vs.expire_quiescent_template", "1",
           "a persistence template (ClientIP affinity) that points at a real server of weight 0 "
           "(terminating) expires, so a pinned client is scheduled to a live endpoint instead of "
           "following its template to the terminating one"),
    Sysctl("net.ipv4.ip_forward", "1",
           "replies from endpoints to clients outside the node are forwarded (de-NATed by IPVS "
           "in FORWARD); the node's routing needs it anyway"),
)


class Sysctls(abc.ABC):
    @abc.abstractmethod
    def read(self, key: str) -> str | None:
        """The current value, or None when the key does not exist."""

    @abc.abstractmethod
    def write(self, key: str, value: str) -> None: ...

    def read_many(self, keys: Iterable[str]) -> dict[str, str | None]:
        return {key: self.read(key) for key in keys}


def ensure_sysctls(sysctls: Sysctls, wanted: Iterable[Sysctl] = IPVS_SYSCTLS) -> list[str]:
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


class FakeSysctls(Sysctls):
    def __init__(self, values: dict[str, str] | None = None):
        self.values = dict(values) if values is not None else {s.key: "0" for s in IPVS_SYSCTLS}
        self.writes: list[tuple[str, str]] = []

    def read(self, key: str) -> str | None:
        return self.values.get(key)

    def write(self, key: str, value: str) -> None:
        if key not in self.values:
            raise FileNotFoundError(key)
        self.values[key] = value
        self.writes.append((key, value))
