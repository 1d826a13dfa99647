"""`FakeSysctls`: the sysctl seam in memory, for unit tests; a key it was not given does not
exist, as an unloaded module's keys do not."""
from __future__ import annotations

from netagent.kernel.sysctl import Sysctls


class FakeSysctls(Sysctls):
    def __init__(self, values: dict[str, str]):
        self.values = dict(values)
        self.writes: list[tuple[str, str]] = []

    def read(self, key: str) -> str | None:
        return self.values.get(key)

    def write(self, key: str, value: str) -> None:
        if key not in self.values:
            raise FileNotFoundError(key)
        self.values[key] = value
        self.writes.append((key, value))
