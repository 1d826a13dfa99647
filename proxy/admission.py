"""The node-wide budget of endpoint-ports, shared fairly: which version of each Service is programmed.

`ServiceCatalog` (`catalog.py`) hands `Admission.settle` what every Service wants (a version with
its `cost` in endpoint-ports, each already under the per-Service cap of `proxy/limits.py`) and
which Services changed; the answer is the Services whose programmed version changed. The rules,
each against an attack on a shared node (issue 29, item 3):

- **What is programmed stays programmed.** An admitted Service's cost is held until it is
  deleted, shrinks or is rejected for its own fault; nothing another object does (a newcomer,
  an older Service arriving late, another namespace's flood) takes its room away.
- **An update never evicts another Service.** An admitted Service whose new version needs more
  than is free keeps its last admitted version programmed (`held`: rejected `too-large` with
  that said) until room is made; a version that costs no more is always taken at once.
- **Room is shared per namespace, then by age.** A namespace's Services together hold at most
  `endpoint_ports_per_namespace`; when there is room, the waiting Service of the namespace that
  holds least goes first, oldest Service (creationTimestamp, then namespace/name) first within
  its namespace, so one tenant's many Services cannot take every free slot ahead of another's.
- Waiting Services (`refused`: none of their versions is programmed) are tried again only when
  room was freed, so a sync with nothing freed does not walk them.

On a restart everything is new and admission starts from an empty budget in the same fair
order, so every node with the same objects programs the same Services. The numbers are never in a rejection's text: an Event must not tell a tenant how
much room is left to aim for.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Generic, Protocol, TypeVar


class Costed(Protocol):
    @property
    def cost(self) -> int: ...

    @property
    def created(self) -> str: ...


V = TypeVar("V", bound=Costed)


def namespace_of(key: str) -> str:
    return key.rpartition("/")[0]


class Admission(Generic[V]):
    """Which version of each Service holds room in the budget (sync thread only)."""

    def __init__(self, budget: int, per_namespace: int) -> None:
        self.budget = budget
        self.per_namespace = min(per_namespace, budget)
        self.admitted: dict[str, V] = {}     # service key -> the version programmed
        self.refused: set[str] = set()       # no version programmed: waits for room
        self.held: set[str] = set()          # a newer version waits; the admitted one stays programmed
        self.spent = 0
        self._namespace_spent: dict[str, int] = {}

    def namespace_spent(self, namespace: str) -> int:
        return self._namespace_spent.get(namespace, 0)

    def settle(self, wanted: Mapping[str, V], touched: Iterable[str]) -> set[str]:
        """Bring the admitted versions in line with `wanted` after `touched` changed; answers
        the service keys whose programmed version changed."""
        changed: set[str] = set()
        freed = False
        candidates: set[str] = set()
        for key in touched:
            version = wanted.get(key)
            if version is None:
                self.refused.discard(key)
                self.held.discard(key)
                if key in self.admitted:
                    self._release(key)
                    changed.add(key)
                    freed = True
                continue
            old = self.admitted.get(key)
            if old is not None and old == version:
                self.held.discard(key)   # back to what is programmed
                continue
            candidates.add(key)
            freed = freed or (old is not None and version.cost < old.cost)
        if freed:   # room was made: whoever waits may fit now
            candidates.update(key for key in self.refused | self.held if key in wanted)
        for key in self._fair_order(candidates, wanted):
            if self._try(key, wanted[key]):
                changed.add(key)
        return changed

    def _fair_order(self, candidates: set[str], wanted: Mapping[str, V]) -> Iterable[str]:
        """The namespace holding least first, then its oldest Service; a namespace's turn is
        weighed again after each of its Services is tried."""
        queues: dict[str, list[str]] = {}
        for key in sorted(candidates, key=lambda k: (wanted[k].created or "~", k), reverse=True):
            queues.setdefault(namespace_of(key), []).append(key)   # oldest last: popped first

        def turn(namespace: str) -> tuple[int, str, str]:
            head = queues[namespace][-1]
            return self.namespace_spent(namespace), wanted[head].created or "~", head

        heap = [turn(namespace) for namespace in queues]
        heapq.heapify(heap)
        while heap:
            namespace = namespace_of(heapq.heappop(heap)[2])
            queue = queues[namespace]
            yield queue.pop()
            if queue:
                heapq.heappush(heap, turn(namespace))

    def _try(self, key: str, version: V) -> bool:
        old = self.admitted.get(key)
        delta = version.cost - (old.cost if old is not None else 0)
        namespace = namespace_of(key)
        fits = delta <= 0 or (self.spent + delta <= self.budget
                              and self.namespace_spent(namespace) + delta <= self.per_namespace)
        if not fits:
            (self.held if old is not None else self.refused).add(key)
            return False
        self.admitted[key] = version
        self.spent += delta
        self._namespace_spent[namespace] = self.namespace_spent(namespace) + delta
        self.refused.discard(key)
        self.held.discard(key)
        return True

    def _release(self, key: str) -> None:
        old = self.admitted.pop(key)
        namespace = namespace_of(key)
        self.spent -= old.cost
        left = self.namespace_spent(namespace) - old.cost
        if left:
            self._namespace_spent[namespace] = left
        else:
            self._namespace_spent.pop(namespace, None)
