"""What the lab API server's unit tests share: a server per test, a `kubernetes` client on it
(built by the agent's own `load_api_client` from a kubeconfig), and watch helpers.

Test modules import the fixtures by name (`server`, `api_client`, `core`) so that pytest finds them.
"""
from __future__ import annotations

import json
import threading
import urllib.request

import pytest
from kubernetes import client, watch

from netagent.kube.config import load_api_client


def write_kubeconfig(path, url: str) -> str:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "lab", "cluster": {"server": url}}],
        "users": [{"name": "agent", "user": {"token": "lab-token"}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "agent"}}],
        "current-context": "lab",
    }
    path.write_text(json.dumps(document))
    return str(path)


@pytest.fixture
def server(lab_api_servers):
    return lab_api_servers(bookmark_interval=0.2)


@pytest.fixture
def api_client(server, tmp_path):
    with load_api_client(kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", server.url)) as api_client:
        yield api_client


@pytest.fixture
def core(api_client):
    return client.CoreV1Api(api_client)


def node(name: str, **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": {}}


SETTLE = 30.0  # seconds a test waits for a watch or a stream (never reached when passing; a loaded CI is slow)


def collect_watch(stream_factory, *, until, timeout: float = SETTLE) -> list[dict]:
    """Run a Watch stream on a thread until `until(events)` holds; return the raw events."""
    events: list[dict] = []
    failures: list[BaseException] = []
    done = threading.Event()
    stopper = watch.Watch()

    def run():
        try:
            for event in stream_factory(stopper):
                events.append({"type": event["type"], "object": event["raw_object"]})
                if until(events):
                    stopper.stop()
                    break
        except BaseException as error:  # noqa: BLE001 (reported by the assertion below)
            failures.append(error)
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert done.wait(timeout), f"watch did not see the expected events; got {events}"
    assert not failures, f"the watch failed after {events}: {failures[0]!r}"
    return events


def raw_watch_lines(url: str) -> list[dict]:
    """A whole watch response read with the stdlib: the events as the server wrote them."""
    with urllib.request.urlopen(url, timeout=SETTLE) as response:
        assert response.status == 200
        return [json.loads(line) for line in response.read().splitlines()]
