"""`netagent status bgp [--json]`: our BIRD's BGP sessions, read from its control socket.

Each peer's address, AS, state (BIRD's and BGP's), since when, routes imported and exported,
and the last error, from `show protocols all` (`noderoutes/bgp/status.py` parses it). The
socket is found in the agent's state directory (`--bgp-state-dir`); a BIRD that is not
running is an error with BIRD's words, exit code 1.
"""
from __future__ import annotations

import json

from netagent.noderoutes.bgp.status import SessionStatus, parse_protocols


def bgp_status(*, state_dir: str) -> list[SessionStatus]:
    from netagent.noderoutes.bgp.supervisor import BirdSupervisor
    return parse_protocols(BirdSupervisor(state_dir).show_protocols())


def render_bgp_status(sessions: list[SessionStatus], *, as_json: bool) -> str:
    if as_json:
        return json.dumps({"peers": [s.as_dict() for s in sessions]}, indent=2)
    if not sessions:
        return "no BGP sessions"
    rows = [("PEER", "AS", "STATE", "SINCE", "IMPORTED", "EXPORTED", "LAST ERROR")]
    rows += [(s.neighbor or s.name, str(s.neighbor_as or "?"), s.bgp_state or s.state, s.since, str(s.imported),
              str(s.exported), s.last_error or "-") for s in sessions]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1]
                     for row in rows)
