"""The lab's kubeconfigs, and the loopback listener that lets kubectl on the host reach the lab.

The API server runs in the lab's router namespace, at 198.18.16.1:6443 for the nodes and
pods. For the host (the namespace that ran `lab up`), `lab up` opens a TCP socket listening
on 127.0.0.1 there and hands it to the API server process, which serves it as a second
listener: the same process and state, and no route, address or iptables rule of the host
changes. `render_kubeconfig` writes what kubectl reads: one context per way in, no
credentials (the lab API server has no authentication).
"""
from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def host_listener(port: int | None) -> Iterator[socket.socket]:
    """A socket listening on 127.0.0.1:`port` (the previous one, so a restarted API server stays
    where kubeconfigs point; any free port when that is taken or None). Closed on exit: by then
    the API server process holds its own copy."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("127.0.0.1", port or 0))
        except OSError:
            listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        yield listener
    finally:
        listener.close()


def render_kubeconfig(servers: dict[str, str], *, current: str | None = None) -> dict:
    """A kubeconfig with a cluster and a context per (name, server URL); `current` (default: the first)."""
    names = list(servers)
    return {
        "apiVersion": "v1", "kind": "Config", "preferences": {}, "current-context": current or names[0],
        "clusters": [{"name": name, "cluster": {"server": url}} for name, url in servers.items()],
        "users": [{"name": "lab", "user": {}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "lab"}} for name in names],
    }
