"""`FakeLearntRoutes`: our BGP table in memory; `learn`/`forget` play BIRD writing it; `main_gateways`
the next hops of main's routes that are not ours."""
from __future__ import annotations

from typing import Callable

from netagent.kernel.families import IpFamily
from netagent.noderoutes.bgp.learnt import LearntRoutes
from netagent.noderoutes.routing.model import Route


class FakeLearntRoutes(LearntRoutes):
    def __init__(self) -> None:
        self.routes: dict = {}
        self.blackholes: set = set()
        self.main_gateways: tuple = ()
        self._callbacks: list[Callable[[], None]] = []

    def dump(self) -> dict:
        return dict(self.routes)

    def watch(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def gateways(self) -> tuple:
        return tuple(sorted(self.main_gateways))

    def ensure_blackholes(self, cidrs: tuple) -> None:
        self.blackholes = {c for c in cidrs if IpFamily.V4.holds(c)}

    def flush(self) -> list[str]:
        removed = [f"route {dst} table fake" for dst in self.routes] + [f"blackhole {c}" for c in self.blackholes]
        self.routes.clear()
        self.blackholes.clear()
        return removed

    def learn(self, route: Route) -> None:
        self.routes[route.dst] = route
        for callback in self._callbacks:
            callback()

    def forget(self, dst) -> None:
        self.routes.pop(dst, None)
        for callback in self._callbacks:
            callback()
