"""The status page's HTML: one node, its routing peers, its Services, its pods' policy and its
BGP sessions, rendered from plain values (`StatusPage`) with no I/O.

Pure so it can be tested on hostile values alone: status_page.py reads the kernel (and the
running agent) through the status readers and hands the values here; the agent serves the
result on its metrics address (`/status`) and `netagent status html` writes it to a file.
Every string on the page is an object's or the kernel's, so every one goes through `_e`
(html.escape, quotes too) and nothing else reaches the text; the page is self-contained
(inline CSS, no script, no external URL; a Content-Security-Policy meta forbids both) and
bounded: at most `MAX_ROWS` rows a table and `MAX_ITEMS` items a cell, each cut to
`MAX_TEXT` characters, the rest counted as "N more".
"""
from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

MAX_ROWS = 200       # rows of one table
MAX_ITEMS = 8        # endpoints or allow rules in one cell
MAX_TEXT = 300       # characters of one string

CONTENT_TYPE = "text/html; charset=utf-8"


@dataclass(frozen=True)
class RouteRow:
    """A route to a peer's pods as the kernel holds it, and the peer's Node when known."""
    destination: str
    via: str = ""
    device: str = ""
    node: str = ""


@dataclass(frozen=True)
class ServiceRow:
    name: str
    kind: str
    address: str
    backends: tuple[str, ...] = ()


@dataclass(frozen=True)
class PolicyRow:
    """One direction of one isolated pod (policy/readback.py's `PodDirection`, as text)."""
    direction: str
    policies: tuple[str, ...]
    allows: tuple[str, ...]
    denied_packets: int


@dataclass(frozen=True)
class PodRow:
    pod: str
    address: str
    isolated: tuple[PolicyRow, ...] = ()   # empty: open both ways


@dataclass(frozen=True)
class BgpRow:
    peer: str
    asn: str
    state: str
    since: str
    imported: int
    exported: int
    last_error: str = ""


@dataclass(frozen=True)
class Section:
    """A section's rows, or why there are none: `off` (the feature is off on this node) or
    `error` (reading it failed; the other sections still show)."""
    rows: tuple = ()
    off: str = ""
    error: str = ""


@dataclass(frozen=True)
class StatusPage:
    node: str
    source: str                       # where it was read: "the agent" / "the kernel (netagent status html)"
    generated: str                    # when, as text
    facts: tuple[tuple[str, str], ...] = ()    # (label, value): proxy mode, pod CIDRs, ...
    peers: Section = field(default_factory=Section)
    services: Section = field(default_factory=Section)
    pods: Section = field(default_factory=Section)
    bgp: Section = field(default_factory=Section)


def _e(text: object) -> str:
    """A string for the page: cut to MAX_TEXT characters, then escaped (quotes too)."""
    value = str(text)
    if len(value) > MAX_TEXT:
        value = value[:MAX_TEXT] + "\u2026"
    return html.escape(value, quote=True)


def _more(count: int, what: str) -> str:
    return f'<span class="more">{count} more {_e(what)}</span>'


def _items(items: Sequence[str], *, empty: str, what: str) -> str:
    """A cell's list, at most MAX_ITEMS of it."""
    if not items:
        return f'<span class="none">{_e(empty)}</span>'
    shown = [f"<div>{_e(item)}</div>" for item in items[:MAX_ITEMS]]
    if len(items) > MAX_ITEMS:
        shown.append(f"<div>{_more(len(items) - MAX_ITEMS, what)}</div>")
    return "".join(shown)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, total: int, what: str) -> str:
    """A table of cells already escaped (each built by `_e` or `_items`), at most MAX_ROWS rows."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = ["<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>"
            for _, row in zip(range(MAX_ROWS), rows)]
    if total > MAX_ROWS:
        body.append(f'<tr><td colspan="{len(headers)}">{_more(total - MAX_ROWS, what)}</td></tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _section(anchor: str, title: str, section: Section, *, empty: str, table: str) -> str:
    if section.error:
        inner = f'<p class="error">could not read: {_e(section.error)}</p>'
    elif section.off:
        inner = f'<p class="none">{_e(section.off)}</p>'
    elif not section.rows:
        inner = f'<p class="none">{_e(empty)}</p>'
    else:
        inner = table
    count = f' <span class="count">({len(section.rows)})</span>' if section.rows else ""
    return f'<section id="{anchor}"><h2>{_e(title)}{count}</h2>{inner}</section>'


def _peers(section: Section) -> str:
    rows = [(_e(r.node or "?"), _e(r.destination), _e(r.via or "-"), _e(r.device or "-")) for r in section.rows]
    return _section("peers", "Routing peers", section, empty="no routes to peers (a single node, or none admitted)",
                    table=_table(("node", "pod CIDR", "via", "device"), rows, total=len(rows), what="routes"))


def _services(section: Section) -> str:
    rows = [(_e(r.name), _e(r.kind), _e(r.address),
             _items(r.backends, empty="no endpoints (rejects)", what="endpoints")) for r in section.rows]
    return _section("services", "Services", section, empty="no Service addresses programmed",
                    table=_table(("Service", "kind", "address", "endpoints"), rows, total=len(rows), what="addresses"))


def _isolation(pod: PodRow, direction: str) -> str:
    for row in pod.isolated:
        if row.direction == direction:
            policies = ", ".join(row.policies)
            return (f'<div class="isolated">isolated by {_e(policies)}</div>'
                    + _items(row.allows, empty="allows nothing", what="allow rules")
                    + f'<div class="denied">{_e(row.denied_packets)} packet(s) denied</div>')
    return '<span class="open">open</span>'


def _pods(section: Section) -> str:
    rows = [(_e(p.pod), _e(p.address), _isolation(p, "ingress"), _isolation(p, "egress")) for p in section.rows]
    return _section("policy", "Pods and their policy", section, empty="no pod programmed on this node",
                    table=_table(("pod", "address", "ingress", "egress"), rows, total=len(rows), what="pods"))


def _bgp(section: Section) -> str:
    rows = [(_e(r.peer), _e(r.asn), _e(r.state), _e(r.since), _e(r.imported), _e(r.exported), _e(r.last_error or "-"))
            for r in section.rows]
    return _section("bgp", "BGP sessions", section, empty="no BGP sessions",
                    table=_table(("peer", "AS", "state", "since", "imported", "exported", "last error"), rows,
                                 total=len(rows), what="sessions"))


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f4f6f8;color:#1c2430}
header{background:#1f3a5f;color:#fff;padding:16px 24px}
header h1{margin:0 0 4px;font-size:22px}
header p{margin:0;opacity:.85}
nav{padding:8px 24px;background:#e3e9f0}
nav a{margin-right:16px;color:#1f3a5f}
main{padding:8px 24px 24px}
section{background:#fff;border:1px solid #d5dde6;border-radius:6px;margin:16px 0;padding:8px 16px 16px}
h2{font-size:17px;margin:8px 0}
.count{color:#6b7785;font-weight:normal}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;vertical-align:top;padding:4px 8px;border-bottom:1px solid #e6ebf0;word-break:break-all}
th{background:#eef2f6}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:2px 16px;margin:8px 0}
dt{color:#6b7785}dd{margin:0}
.none{color:#6b7785;font-style:italic}
.error{color:#a00;font-weight:bold}
.more{color:#6b7785;font-style:italic}
.open{color:#2b7a2b}
.isolated{color:#8a4b00;font-weight:bold}
.denied{color:#6b7785}
"""

# no script, no request anywhere: the page shows the same as a file and from the agent
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def render_page(page: StatusPage) -> str:
    facts = "".join(f"<dt>{_e(label)}</dt><dd>{_e(value)}</dd>" for label, value in page.facts)
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f"<title>netagent: {_e(page.node)}</title><style>{STYLE}</style></head><body>",
        f"<header><h1>netagent on node {_e(page.node)}</h1>",
        f"<p>read from {_e(page.source)} at {_e(page.generated)}</p></header>",
        '<nav><a href="#peers">peers</a><a href="#services">Services</a><a href="#policy">policy</a>'
        '<a href="#bgp">BGP</a></nav><main>',
        f'<section id="node"><h2>This node</h2><dl class="facts">{facts}</dl></section>' if facts else "",
        _peers(page.peers), _services(page.services), _pods(page.pods), _bgp(page.bgp),
        "</main></body></html>\n"])


def render_index() -> str:
    """`/` on the metrics address: where the pages are (no redirect: a link needs no header)."""
    links = "".join(f'<li><a href="{path}">{path}</a> {_e(what)}</li>' for path, what in (
        ("/status", "this node, its peers, Services, policy and BGP, as a page"),
        ("/metrics", "Prometheus metrics"), ("/healthz", "health, with details"),
        ("/services", "Services as JSON (when the service proxy runs)")))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>netagent</title><style>{STYLE}</style></head><body><header><h1>netagent</h1></header>"
            f"<main><section><ul>{links}</ul></section></main></body></html>\n")
