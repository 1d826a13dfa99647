"""A set of throwaway network namespaces with roles, for tests that wire their own topology.

Subclasses name their roles and wire them in `_build()`; this base creates the namespaces,
removes them (and stops the servers started in them) on exit or when building fails
half-way, and starts servers that print "ready" once they listen.
"""
from __future__ import annotations

import abc
import subprocess

from netagent.kernel import namespaces

PREFIX = "na-t"


class NamespaceTopology(abc.ABC):
    def __init__(self, roles) -> None:
        self.names = {role: namespaces.unique_name(f"{PREFIX}-{role}") for role in roles}
        self.servers: list[subprocess.Popen] = []

    def __enter__(self):
        try:
            for name in self.names.values():
                namespaces.create(name)
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    @abc.abstractmethod
    def _build(self) -> None:
        """Wire the roles' namespaces (they exist already)."""

    def run(self, role: str, *argv: str):
        return namespaces.run_in(self.names[role], list(argv), check=True)

    def start_server(self, role: str, argv: list[str]) -> None:
        """Run `argv` in `role`'s namespace until close(); wait for its "ready" line."""
        server = subprocess.Popen([*namespaces.exec_prefix(self.names[role]), *argv], stdout=subprocess.PIPE,
                                  text=True)
        self.servers.append(server)
        assert server.stdout.readline().strip() == "ready"

    def close(self) -> None:
        for server in self.servers:
            server.kill()
            server.wait()
        for name in self.names.values():
            namespaces.remove(name)
