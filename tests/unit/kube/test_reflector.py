"""The reflector against the lab API server over loopback TCP, through the official client.

Outages are made two ways: a `FaultyProxy` between the reflector and the server that cuts
every connection and refuses new ones, and a real stop/restart of the server on the same
port with its state file (changed meanwhile by another server instance).
"""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from kubernetes import client

from lab.apiserver import ApiServer
from netagent.kube.config import KubeApiError, request_json
from netagent.kube.nodes import get_node, patch_node_annotations
from netagent.kube.reflector import Backoff, Reflector
from netagent.kube.resources import NODES, SERVICES, object_key
from tests.unit.project.free_ports import ports_below_the_ephemeral_range

FAST_BACKOFF = Backoff(initial=0.05, maximum=0.2, factor=2, jitter=0.2)
SETTLE = 30.0  # seconds a test waits for the reflector to catch up (never reached when passing; a loaded CI is slow)


def node(name: str, **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": {}}


class RecordingHandler:
    """Records (event, name) pairs; can be told to raise on chosen names."""

    def __init__(self, *, raise_on: frozenset[str] = frozenset()) -> None:
        self.events: list[tuple[str, str]] = []
        self.objects: list[dict] = []
        self.raise_on = raise_on
        self._changed = threading.Condition()

    def _record(self, kind: str, obj: dict | None) -> None:
        with self._changed:
            self.events.append((kind, obj["metadata"]["name"] if obj else ""))
            if obj is not None:
                self.objects.append(obj)
            self._changed.notify_all()
        if obj is not None and obj["metadata"]["name"] in self.raise_on:
            raise RuntimeError(f"handler bug on {obj['metadata']['name']}")

    def on_add(self, obj: dict) -> None:
        self._record("add", obj)

    def on_update(self, old: dict, new: dict) -> None:
        assert old["metadata"]["name"] == new["metadata"]["name"]
        self._record("update", new)

    def on_delete(self, obj: dict) -> None:
        self._record("delete", obj)

    def on_synced(self) -> None:
        self._record("synced", None)

    def wait_for(self, predicate, *, timeout: float = SETTLE) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: predicate(self.events), timeout), f"got {self.events}"

    def clear(self) -> None:
        with self._changed:
            self.events.clear()


def wait_until(predicate, *, timeout: float = SETTLE) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


class FaultyProxy:
    """A TCP proxy in front of the API server that can cut all connections and refuse new ones."""

    def __init__(self, target_port: int) -> None:
        self._target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._up = True
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:  # one step with cut(): a connection accepted as it cuts is cut too
                if not self._up:
                    downstream.close()
                    continue
                upstream = socket.create_connection(self._target)
                self._sockets.update((downstream, upstream))
            for source, sink in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self._lock:
            self._up = False
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def restore(self) -> None:
        self._up = True

    def close(self) -> None:
        self.cut()
        self._listener.close()


@pytest.fixture
def server(lab_api_servers):
    return lab_api_servers(bookmark_interval=0.1)


def api_client_for(url: str) -> client.ApiClient:
    return client.ApiClient(client.Configuration(host=url))


@pytest.fixture
def reflectors():
    """Start reflectors through `make(...)`; all are stopped at the end."""
    started: list[tuple[Reflector, client.ApiClient]] = []

    def make(url: str, handler, **options) -> Reflector:
        api_client = api_client_for(url)
        options.setdefault("resource", NODES)
        options.setdefault("backoff", FAST_BACKOFF)
        reflector = Reflector(api_client=api_client, handler=handler, **options)
        reflector.start()
        started.append((reflector, api_client))
        return reflector

    yield make
    for reflector, api_client in started:
        reflector.stop()
        api_client.close()


# ---------------------------------------------------------------------------------------------
def test_initial_list_is_paged_delivered_then_synced(server, reflectors):
    for index in range(7):
        server.create(node(f"n{index}"))
    handler = RecordingHandler()
    reflector = reflectors(server.url, handler, page_size=3)
    assert reflector.synced.wait(SETTLE)
    assert handler.events == [("add", f"n{index}") for index in range(7)] + [("synced", "")]
    assert reflector.stats.list_requests == 3 and reflector.stats.lists == 1
    assert sorted(reflector.store.keys()) == [f"n{index}" for index in range(7)]
    assert reflector.store.get("n3")["kind"] == "Node"  # list items get their kind back
    assert reflector.last_resource_version == str(server.resource_version)


def test_watch_events_reach_the_store_and_the_handler(server, reflectors):
    handler = RecordingHandler()
    reflector = reflectors(server.url, handler)
    assert reflector.synced.wait(SETTLE)
    server.create(node("n1"))
    server.patch(NODES, "n1", {"metadata": {"labels": {"x": "1"}}})
    handler.wait_for(lambda events: ("update", "n1") in events)
    assert reflector.store.get("n1")["metadata"]["labels"] == {"x": "1"}
    server.delete(NODES, "n1")
    handler.wait_for(lambda events: ("delete", "n1") in events)
    assert handler.events == [("synced", ""), ("add", "n1"), ("update", "n1"), ("delete", "n1")]
    assert reflector.store.get("n1") is None
    assert reflector.last_resource_version == str(server.resource_version)
    counts = reflector.stats.events_by_type()
    assert (counts["ADDED"], counts["MODIFIED"], counts["DELETED"]) == (1, 1, 1)


def test_a_bookmark_only_advances_the_resource_version(server, reflectors):
    handler = RecordingHandler()
    reflector = reflectors(server.url, handler)
    assert reflector.synced.wait(SETTLE)
    before = int(reflector.last_resource_version)
    server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "elsewhere"}})
    wait_until(lambda: int(reflector.last_resource_version) == server.resource_version)
    assert int(reflector.last_resource_version) > before
    assert reflector.stats.events["BOOKMARK"] >= 1
    assert handler.events == [("synced", "")]


def test_a_watch_that_ends_is_reopened_from_the_last_resource_version(server, reflectors):
    handler = RecordingHandler()
    reflector = reflectors(server.url, handler, watch_timeout=1)
    assert reflector.synced.wait(SETTLE)
    wait_until(lambda: reflector.stats.watch_restarts >= 1)
    server.create(node("late"))
    handler.wait_for(lambda events: ("add", "late") in events)
    assert reflector.stats.lists == 1 and reflector.stats.relists_after_expired == 0


def test_outage_then_compaction_gives_410_and_a_relist_that_delivers_the_differences(server, reflectors):
    for name in ("keep", "change", "remove"):
        server.create(node(name))
    proxy = FaultyProxy(server.port)
    try:
        handler = RecordingHandler()
        reflector = reflectors(proxy.url, handler)
        assert reflector.synced.wait(SETTLE)
        handler.clear()
        proxy.cut()
        wait_until(lambda: reflector.stats.failed_requests >= 2)
        server.patch(NODES, "change", {"metadata": {"labels": {"changed": "yes"}}})
        server.delete(NODES, "remove")
        server.create(node("new"))
        server.compact()
        proxy.restore()
        handler.wait_for(lambda events: len(events) == 3)
        assert sorted(handler.events) == [("add", "new"), ("delete", "remove"), ("update", "change")]
        assert reflector.stats.relists_after_expired == 1 and reflector.stats.lists == 2
        assert reflector.stats.outages == reflector.stats.errors == 1
        assert reflector.stats.relists == 2
        assert sorted(reflector.store.keys()) == ["change", "keep", "new"]
        server.create(node("after"))
        handler.wait_for(lambda events: ("add", "after") in events)
    finally:
        proxy.close()


def start_below_the_ephemeral_ports(server: ApiServer) -> int:
    """Start `server` on a port nothing can take while it is down (tests/unit/project/free_ports.py)."""
    for port in ports_below_the_ephemeral_range():
        try:
            server.start(port=port)
        except OSError:
            continue  # in use by somebody else: try another
        return port
    raise AssertionError("no free port below the ephemeral range")


def test_api_server_restart_on_the_same_port_delivers_a_delete_made_while_it_was_down(tmp_path, reflectors):
    state = str(tmp_path / "state.json")
    first = ApiServer(state_file=state, bookmark_interval=0.1)
    port = start_below_the_ephemeral_ports(first)
    first.create(node("stays"))
    first.create(node("goes"))
    handler = RecordingHandler()
    reflector = reflectors(first.url, handler)
    assert reflector.synced.wait(SETTLE)
    handler.clear()
    first.stop()
    wait_until(lambda: reflector.stats.failed_requests >= 1)
    offline = ApiServer(state_file=state)  # another instance edits the state while no server runs
    offline.delete(NODES, "goes")
    offline.stop()
    restarted = ApiServer(state_file=state, bookmark_interval=0.1)
    restarted.start(port=port)
    try:
        handler.wait_for(lambda events: ("delete", "goes") in events)
        assert handler.events == [("delete", "goes")]
        assert reflector.stats.outages == 1 and reflector.stats.relists_after_expired == 1
        restarted.create(node("new"))
        handler.wait_for(lambda events: ("add", "new") in events)
    finally:
        restarted.stop()


def test_a_handler_that_raises_does_not_stop_the_reflector(server, reflectors):
    handler = RecordingHandler(raise_on=frozenset({"bad"}))
    reflector = reflectors(server.url, handler)
    assert reflector.synced.wait(SETTLE)
    server.create(node("bad"))
    server.create(node("good"))
    handler.wait_for(lambda events: ("add", "good") in events)
    assert reflector.stats.handler_errors == 1
    assert "bad" in reflector.store


def test_a_label_selector_reflector_sees_objects_leave_and_enter(server, reflectors):
    server.create(node("n1", role="edge"))
    server.create(node("n2", role="core"))
    handler = RecordingHandler()
    reflector = reflectors(server.url, handler, label_selector="role=edge")
    assert reflector.synced.wait(SETTLE)
    server.patch(NODES, "n1", {"metadata": {"labels": {"role": "core"}}})
    server.patch(NODES, "n2", {"metadata": {"labels": {"role": "edge"}}})
    handler.wait_for(lambda events: len(events) == 4)
    assert handler.events == [("add", "n1"), ("synced", ""), ("delete", "n1"), ("add", "n2")]
    assert reflector.store.keys() == ["n2"]


def test_namespaced_resource_keys(server, reflectors):
    server.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}})
    reflector = reflectors(server.url, RecordingHandler(), resource=SERVICES)
    assert reflector.synced.wait(SETTLE)
    assert reflector.store.keys() == ["default/web"]
    assert object_key(reflector.store.get("default/web")) == "default/web"


def test_stop_is_prompt_while_watching_and_while_backing_off(server):
    watching = Reflector(api_client=api_client_for(server.url), resource=NODES, handler=RecordingHandler())
    watching.start()
    assert watching.synced.wait(SETTLE) and watching.running
    wait_until(lambda: server.watcher_count() == 1)
    started = time.monotonic()
    watching.stop()
    assert time.monotonic() - started < 15  # no wait for the watch's timeout (minutes); generous for a loaded CI
    assert not watching.running
    wait_until(lambda: server.watcher_count() == 0)

    unused = socket.create_server(("127.0.0.1", 0))
    dead_port = unused.getsockname()[1]
    unused.close()
    backing_off = Reflector(
        api_client=api_client_for(f"http://127.0.0.1:{dead_port}"),
        resource=NODES,
        handler=RecordingHandler(),
        backoff=Backoff(initial=300, maximum=300),
    )
    backing_off.start()
    wait_until(lambda: backing_off.stats.failed_requests >= 1)
    started = time.monotonic()
    backing_off.stop()
    assert time.monotonic() - started < 15  # no wait for the 300 s backoff; generous for a loaded CI
    assert not backing_off.running
    assert backing_off.stats.outages == 1 and not backing_off.synced.is_set()


def test_node_helpers_patch_annotations_and_read(server):
    server.create(node("n1"))
    with api_client_for(server.url) as api_client:
        patched = patch_node_annotations(api_client, "n1", {"netagent.io/public-ip": "10.0.0.1", "x": "y"})
        assert patched["metadata"]["annotations"] == {"netagent.io/public-ip": "10.0.0.1", "x": "y"}
        patch_node_annotations(api_client, "n1", {"x": None})
        assert get_node(api_client, "n1")["metadata"]["annotations"] == {"netagent.io/public-ip": "10.0.0.1"}
        with pytest.raises(KubeApiError) as missing:
            get_node(api_client, "nope")
        assert missing.value.status == 404 and missing.value.reason == "NotFound"


def test_backoff_grows_caps_and_jitters():
    backoff = Backoff(initial=0.5, maximum=4, factor=2, jitter=0.2)
    assert [round(Backoff(initial=0.5, maximum=4, factor=2, jitter=0).delay(n), 3) for n in range(6)] == [
        0.5, 1.0, 2.0, 4.0, 4.0, 4.0
    ]
    delays = [backoff.delay(10) for _ in range(200)]
    assert min(delays) >= 3.2 and max(delays) <= 4.8 and len(set(delays)) > 100


# ---------------------------------------------------------------------------------------------
# measurements (printed; run with -s to see them)
# ---------------------------------------------------------------------------------------------
def test_listing_10000_nodes_in_pages_delivers_each_once_then_synced(server, reflectors):
    """bench/reflector.py measures this list against the official client's."""
    for index in range(10000):
        server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{index:05d}"},
                       "spec": {"podCIDR": f"10.{index // 256}.{index % 256}.0/24"}})
    handler = RecordingHandler()
    reflector = reflectors(server.url, handler, page_size=500)
    assert reflector.synced.wait(SETTLE)
    assert len(reflector.store) == 10000 and reflector.stats.list_requests == 20
    assert handler.events == [("add", f"node-{index:05d}") for index in range(10000)] + [("synced", "")]


class LaxServer:
    """A lax API server for Nodes: its list holds objects no real server would store (no
    name, a non-string namespace, not an object at all) beside good ones, and its watch sends
    such objects before a good one."""

    LIST = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "5"},
            "items": [{"metadata": {}}, "not-an-object", {"metadata": {"name": "odd", "namespace": 7}},
                      node("good-1"), {"metadata": None}]}
    WATCH = [{"type": "ADDED", "object": {"metadata": {"name": None, "resourceVersion": "6"}}},
             {"type": "ADDED", "object": [1, 2]},
             {"type": "ADDED", "object": {**node("good-2"), "metadata": {"name": "good-2", "resourceVersion": "7"}}}]

    def __init__(self) -> None:
        import http.server

        lax = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                watching = "watch=true" in self.path.lower()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if not watching:
                    body = json.dumps(lax.LIST).encode()
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.end_headers()
                for event in lax.WATCH:  # then the watch ends (HTTP/1.0: the stream is read to its close)
                    self.wfile.write(json.dumps(event).encode() + b"\n")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_objects_a_lax_server_sends_without_a_usable_name_are_skipped_and_cost_no_other(reflectors):
    lax = LaxServer()
    try:
        handler = RecordingHandler()
        reflector = reflectors(lax.url, handler)
        assert reflector.synced.wait(SETTLE), "one unkeyable object kept the whole list from syncing"
        handler.wait_for(lambda events: ("add", "good-2") in events)
        assert sorted(reflector.store.keys()) == ["good-1", "good-2"]
        assert reflector.stats.unkeyed_objects >= 6  # 4 listed, 2 watched (a reopened watch repeats them)
        assert reflector.stats.handler_errors == 0
    finally:
        lax.stop()
