"""The lab API server's watches, driven by the official `kubernetes` client and by raw HTTP:
ADDED/MODIFIED/DELETED with rising resource versions, bookmarks, 410 for compacted
history, selectors turning label changes into ADDED/DELETED, and streams ending on stop.
"""
from __future__ import annotations

import threading
import time
import urllib.request

import pytest
from kubernetes import client, watch

from lab.apiclient import LabApiClient
from lab.apiserver import ApiServer
from tests.unit.lab.kube_apiserver_support import api_client, core, server  # noqa: F401 (fixtures)
from tests.unit.lab.kube_apiserver_support import SETTLE, collect_watch, node, raw_watch_lines


# ---------------------------------------------------------------------------------------------
# watch
# ---------------------------------------------------------------------------------------------
def test_watch_sends_added_modified_deleted_with_rising_resource_versions(core):
    start = core.list_node().metadata.resource_version

    def writer():
        time.sleep(0.2)
        core.create_node(node("n1"))
        core.patch_node("n1", {"metadata": {"labels": {"x": "1"}}})
        core.delete_node("n1")

    threading.Thread(target=writer, daemon=True).start()
    events = collect_watch(
        lambda w: w.stream(core.list_node, resource_version=start, timeout_seconds=60),
        until=lambda evs: len(evs) == 3,
    )
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert events[1]["object"]["metadata"]["labels"] == {"x": "1"}
    assert events[0]["object"]["kind"] == "Node"


def test_watch_from_resource_version_zero_starts_with_current_objects(core, server):
    server.create(node("a"))
    server.create(node("b"))
    events = collect_watch(
        lambda w: w.stream(core.list_node, resource_version="0", timeout_seconds=60),
        until=lambda evs: len(evs) == 2,
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a"), ("ADDED", "b")]


def test_watch_bookmarks_only_when_asked_and_carry_the_latest_resource_version(core, server):
    start = core.list_node().metadata.resource_version
    server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "elsewhere"}})
    events = collect_watch(
        lambda w: w.stream(core.list_node, resource_version=start, allow_watch_bookmarks=True, timeout_seconds=60),
        until=lambda evs: any(e["type"] == "BOOKMARK" for e in evs),
    )
    bookmark = next(e for e in events if e["type"] == "BOOKMARK")
    assert bookmark["object"]["kind"] == "Node"
    assert bookmark["object"]["metadata"]["resourceVersion"] == str(server.resource_version)
    quiet: list[dict] = []
    for event in watch.Watch().stream(core.list_node, resource_version=start, timeout_seconds=1):
        quiet.append(event)
    assert quiet == []


def test_watch_from_a_compacted_resource_version_gets_an_error_event_410(core, server):
    old = core.list_node().metadata.resource_version
    server.create(node("a"))
    server.compact()
    (event,) = raw_watch_lines(f"{server.url}/api/v1/nodes?watch=true&resourceVersion={old}")
    assert event["type"] == "ERROR"
    assert (event["object"]["kind"], event["object"]["code"], event["object"]["reason"]) == ("Status", 410, "Expired")
    with pytest.raises(client.ApiException) as expired:
        for _ in watch.Watch().stream(core.list_node, resource_version=old, timeout_seconds=2):
            pass
    assert expired.value.status == 410


def test_history_is_bounded_and_the_stream_ends_at_timeout_seconds():
    with ApiServer(history=3) as small:
        small.start()
        before = small.resource_version
        for index in range(5):
            small.create(node(f"n{index}"))
        too_old = raw_watch_lines(f"{small.url}/api/v1/nodes?watch=true&resourceVersion={before}")
        assert [(e["type"], e["object"]["code"]) for e in too_old] == [("ERROR", 410)]
        started = time.monotonic()
        recent = small.resource_version - 2
        replayed = raw_watch_lines(f"{small.url}/api/v1/nodes?watch=1&resourceVersion={recent}&timeoutSeconds=1")
        # it ended at the asked second, not at the server's watch timeout (minutes); generous for a loaded CI
        assert 0.9 < time.monotonic() - started < 15
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in replayed] == [("ADDED", "n3"), ("ADDED", "n4")]
        ahead = small.resource_version + 2  # what Kubernetes does: wait for it, quiet, then go on from there
        threading.Timer(0.3, lambda: [small.create(node(f"n{index}")) for index in (5, 6, 7)]).start()
        lines = raw_watch_lines(f"{small.url}/api/v1/nodes?watch=1&resourceVersion={ahead}&timeoutSeconds=2")
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "n7")]


def test_watch_with_a_selector_turns_label_changes_into_added_and_deleted(core, server):
    server.create(node("n1", role="edge"))
    start = core.list_node().metadata.resource_version

    def writer():
        time.sleep(0.2)
        core.patch_node("n1", {"metadata": {"labels": {"role": "core"}}})
        core.patch_node("n1", {"metadata": {"labels": {"role": "edge"}}})

    threading.Thread(target=writer, daemon=True).start()
    events = collect_watch(
        lambda w: w.stream(core.list_node, resource_version=start, label_selector="role=edge", timeout_seconds=60),
        until=lambda evs: len(evs) == 2,
    )
    assert [e["type"] for e in events] == ["DELETED", "ADDED"]
    assert events[0]["object"]["metadata"]["labels"] == {"role": "edge"}  # the last content it matched with


def test_stop_ends_open_watch_streams_promptly():
    server = ApiServer()
    server.start()
    api_client = client.ApiClient(client.Configuration(host=server.url))
    core = client.CoreV1Api(api_client)
    ended = threading.Event()

    def watch_forever():
        try:
            for _ in watch.Watch().stream(core.list_node, timeout_seconds=3600):
                pass
        except Exception:  # noqa: BLE001 (a closed connection is an acceptable way to end)
            pass
        ended.set()

    threading.Thread(target=watch_forever, daemon=True).start()
    wait_until(lambda: server.watcher_count() != 0)
    assert server.watcher_count() == 1
    started = time.monotonic()
    server.stop()
    assert ended.wait(SETTLE)
    assert time.monotonic() - started < 10  # not the stream's hour: stop ended it
    api_client.close()


def test_lab_watcher_count_follows_clients(server):
    lab = LabApiClient(url=server.url)
    assert lab.watcher_count() == 0
    response = urllib.request.urlopen(f"{server.url}/api/v1/nodes?watch=1", timeout=SETTLE)
    wait_until(lambda: lab.watcher_count() != 0)
    assert lab.watcher_count() == 1
    response.close()
    wait_until(lambda: lab.watcher_count() == 0)


def wait_until(predicate) -> None:
    deadline = time.monotonic() + SETTLE
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)
