"""`netagent flows`: the agent's recent flows (as `hubble observe`), read from its `/flows` page
on the loopback metrics address, filtered, as a table or JSON lines; `--follow` polls for the
flows after the last one shown until interrupted.

Why a client of the running agent and not of the kernel: the flows are the agent's memory (a
ring its nflog listener fills, policy/flows.py); the kernel keeps no record of what it
dropped but counters. The page is the whole ring and the filters run here, so the agent
serves one cached snapshot (infra/status_server.py) whatever the clients ask.
"""
from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TextIO

from netagent.errors import NetagentError
from netagent.infra.flows import Flow, FlowFilter, parse_page, render_json_lines, render_table
from netagent.infra.status_server import parse_bind

DEFAULT_ADDRESS = "127.0.0.1:10249"
FOLLOW_INTERVAL = 1.0
PAGE_LIMIT = 64 << 20                 # a ring of 1M flows is well under this


class FlowsError(NetagentError):
    """The agent's flows could not be read."""


def fetch(address: str, *, timeout: float = 10.0) -> list[Flow]:
    """The ring the agent at `address` (host:port) serves at /flows."""
    try:
        host, port = parse_bind(address)
    except ValueError as error:
        raise FlowsError(f"--address {address!r}: {error}") from None
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/flows"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            text = answer.read(PAGE_LIMIT + 1)
    except urllib.error.HTTPError as error:
        hint = " (is the agent running with --network-policy and --flows on?)" if error.code == 404 else ""
        raise FlowsError(f"{url}: HTTP {error.code}{hint}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise FlowsError(f"cannot read {url}: {reason} (is the agent running? --address)") from None
    if len(text) > PAGE_LIMIT:
        raise FlowsError(f"{url}: the page is larger than {PAGE_LIMIT} bytes")
    try:
        return parse_page(text.decode("utf-8", "replace")).flows
    except ValueError as error:
        raise FlowsError(str(error)) from None


def show_flows(address: str, keep: FlowFilter, *, as_json: bool, follow: bool, out: TextIO | None = None,
               read: Callable[[str], list[Flow]] = fetch, sleep: Callable[[float], None] = time.sleep,
               rounds: int | None = None) -> int:
    """Print the flows `keep` keeps; with `follow`, then every new one (`rounds`: tests)."""
    out = sys.stdout if out is None else out
    flows = read(address)
    shown = [f for f in flows if keep.keeps(f)]
    last = max((f.sequence for f in flows), default=0)
    if as_json:
        if shown:
            print(render_json_lines(shown), file=out, flush=True)
    else:
        print(render_table(shown), file=out, flush=True)
    done = 0
    while follow and (rounds is None or done < rounds):
        done += 1
        sleep(FOLLOW_INTERVAL)
        flows = read(address)
        newest = max((f.sequence for f in flows), default=0)
        if newest < last:           # the agent restarted: its numbers start again
            last = 0
        fresh = [f for f in flows if f.sequence > last and keep.keeps(f)]
        last = max(last, newest)
        if fresh:
            text = render_json_lines(fresh) if as_json else render_table(fresh).split("\n", 1)[1]
            print(text, file=out, flush=True)
    return 0
