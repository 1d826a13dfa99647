"""BIRD's `show protocols all` as values: one `SessionStatus` per BGP protocol (pure parser).

`netagent status bgp`, the metrics and the tests read sessions from here. The text is BIRD 2's
control socket answer (as `birdc` prints it; the renderer sets `timeformat protocol iso long`,
so `since` is a full timestamp): a summary line per protocol (name, protocol, table, state,
since, info), then indented `key: value` lines; for BGP: `BGP state`, `Neighbor address`,
`Neighbor AS`, `Last error`, and per channel `Routes: N imported, M exported, ...`. Lines the
parser does not know are skipped, so a newer BIRD's additions do no harm.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_SUMMARY = re.compile(r"^(?P<name>[A-Za-z_][\w]*)\s+(?P<proto>\S+)\s+(?P<table>\S+)\s+(?P<state>\S+)\s+"
                      r"(?P<since>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?|\S+)\s*(?P<info>.*)$")
_ROUTES = re.compile(r"^Routes:\s+(\d+) imported, (?:(\d+) filtered, )?(\d+) exported")


@dataclass(frozen=True)
class SessionStatus:
    name: str
    neighbor: str = ""
    neighbor_as: int | None = None
    state: str = ""          # BIRD's protocol state: up, start, down, ...
    bgp_state: str = ""      # Established, Active, Connect, Idle, ...
    since: str = ""          # when the state last changed (the session's uptime when up)
    imported: int = 0
    exported: int = 0
    last_error: str = ""
    info: str = ""
    updates_received: int = 0   # import updates the peer sent
    updates_filtered: int = 0   # of which our import filter refused

    @property
    def up(self) -> bool:
        return self.bgp_state == "Established"

    def as_dict(self) -> dict:
        return {"name": self.name, "neighbor": self.neighbor, "as": self.neighbor_as, "state": self.state,
                "bgpState": self.bgp_state, "since": self.since, "routesImported": self.imported,
                "routesExported": self.exported, "updatesFiltered": self.updates_filtered,
                "lastError": self.last_error}


def parse_protocols(text: str) -> list[SessionStatus]:
    """The BGP protocols of a `show protocols all` answer, in BIRD's order."""
    sessions: list[SessionStatus] = []
    current: dict | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("BIRD ") or line.startswith("Name "):
            continue
        if not raw.startswith(" "):
            if current is not None:
                sessions.append(SessionStatus(**current))
            found = _SUMMARY.match(line)
            current = None
            if found and found["proto"] == "BGP":
                current = {"name": found["name"], "state": found["state"], "since": found["since"],
                           "info": " ".join(found["info"].split())}
            continue
        if current is None:
            continue
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if key == "BGP state":
            current["bgp_state"] = value
        elif key == "Neighbor address":
            current["neighbor"] = value
        elif key == "Neighbor AS" and value.isdigit():
            current["neighbor_as"] = int(value)
        elif key == "Last error":
            current["last_error"] = value
        elif key == "Import updates":
            numbers = value.split()
            if len(numbers) == 5 and numbers[0].isdigit() and numbers[2].isdigit():
                current["updates_received"] = current.get("updates_received", 0) + int(numbers[0])
                current["updates_filtered"] = current.get("updates_filtered", 0) + int(numbers[2])
        elif key == "Routes":
            counts = _ROUTES.match(line.strip())
            if counts:
                current["imported"] = current.get("imported", 0) + int(counts[1])
                current["exported"] = current.get("exported", 0) + int(counts[3])
    if current is not None:
        sessions.append(SessionStatus(**current))
    return sessions
