"""The lab's API server against the real kube-apiserver: the list and watch semantics the agent's
reflector (`netagent/kube/reflector.py`) and its Node announcement (`netagent/kube/nodes.py`)
rely on, each test run on both servers (`api_servers.py` starts each once for the module).

Every assertion is what the real kube-apiserver v1.37 does, found by running it; where the lab
server did otherwise, `lab/apiserver/` was changed so the same test passes on both. Each test
works on Nodes of its own (a name prefix and a `parity` label) so the tests share a server.
The restart test runs last: it drops the lab's watch history.
"""
from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from netagent.kube.config import PatchType, load_api_client, open_request
from netagent.kube.nodes import patch_node_annotations
from netagent.kube.reflector import Backoff, Reflector
from netagent.kube.resources import NODES
from tests.kubernetes import api_servers

NODES_PATH = NODES.list_path()
WAIT = 30.0  # seconds: a bound never reached when passing, generous for a loaded machine


@dataclass
class Api:
    endpoint: api_servers.ApiEndpoint
    client: object

    def request(self, method: str, path: str = NODES_PATH, *, query: list[tuple[str, object]] | None = None,
                body: object = None, patch: PatchType | None = None, timeout: float = WAIT) -> tuple[int, dict]:
        content_type = patch.value if patch else ("application/json" if body is not None else None)
        response = open_request(self.client, method, path, query=query, body=body, content_type=content_type,
                                timeout=timeout)
        try:
            data = response.data
        finally:
            response.release_conn()
        return response.status, json.loads(data)

    def ok(self, method: str, path: str = NODES_PATH, **options) -> dict:
        status, answer = self.request(method, path, **options)
        assert 200 <= status <= 299, (status, answer)
        return answer

    def create_node(self, name: str, **labels: str) -> dict:
        return self.ok("POST", body={"apiVersion": "v1", "kind": "Node",
                                     "metadata": {"name": name, "labels": labels}, "spec": {}})

    def list_rv(self, selector: str) -> str:
        return self.ok("GET", query=[("labelSelector", selector)])["metadata"]["resourceVersion"]

    def watch(self, query: list[tuple[str, object]], *, until: Callable[[list[dict]], bool] = lambda events: False,
              timeout: float = WAIT) -> tuple[int, list[dict], str]:
        """(HTTP status, the events, how the stream ended: "until", "end" or "error: ...") of a watch
        read until `until(events)` holds or the server ends it."""
        response = open_request(self.client, "GET", NODES_PATH, query=[("watch", "true"), *query],
                                timeout=(5.0, timeout))
        if response.status != 200:
            try:
                return response.status, [json.loads(response.data)], "refused"
            finally:
                response.release_conn()
        events: list[dict] = []
        partial = b""
        try:
            for chunk in response.stream(amt=None, decode_content=False):
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                events += [json.loads(line) for line in lines if line.strip()]
                if until(events):
                    return 200, events, "until"
            return 200, events, "end"
        except Exception as error:  # noqa: BLE001 (how the stream ended is the result)
            return 200, events, f"error: {type(error).__name__}"
        finally:
            response.close()
            response.release_conn()


@pytest.fixture(scope="module", params=["lab", "kube-apiserver"])
def api(request) -> Iterator[Api]:
    endpoint = api_servers.start(request.param)
    try:
        with load_api_client(kubeconfig=endpoint.kubeconfig) as client:
            yield Api(endpoint, client)
    finally:
        api_servers.remove(endpoint)


def names(events: list[dict]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]


def test_watch_from_a_list_sees_later_changes_in_order(api):
    api.create_node("order-a", parity="order")
    listed = api.list_rv("parity=order")
    api.create_node("order-b", parity="order")
    api.ok("PATCH", NODES.object_path("order-b"), body={"metadata": {"labels": {"x": "1"}}}, patch=PatchType.MERGE)
    api.ok("DELETE", NODES.object_path("order-b"))
    status, events, _ = api.watch([("resourceVersion", listed), ("labelSelector", "parity=order")],
                                  until=lambda events: any(e["type"] == "DELETED" for e in events))
    assert status == 200
    assert names(events) == [("ADDED", "order-b"), ("MODIFIED", "order-b"), ("DELETED", "order-b")]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert int(listed) < versions[0] < versions[1] < versions[2]  # a DELETED carries the deleting revision


def test_watch_from_zero_starts_with_every_current_object(api):
    api.create_node("zero-a", parity="zero")
    api.create_node("zero-b", parity="zero")
    for version in ("0", ""):
        status, events, _ = api.watch([("resourceVersion", version), ("labelSelector", "parity=zero"),
                                       ("timeoutSeconds", 1)])
        assert status == 200 and sorted(names(events)) == [("ADDED", "zero-a"), ("ADDED", "zero-b")]


def test_a_bookmark_carries_only_a_resource_version_and_comes_before_the_timeout(api):
    """A write the watch's selector filters out reaches the watcher as a BOOKMARK before its
    timeout: the real watch cache sends one within a second or two and again 2 s before the
    timeout; the lab sent them only every `bookmark_interval` (5 s: none in a 4 s watch). (The
    real one sends none while nothing happened to its resource since the watch began.)"""
    api.create_node("bookmark-a", parity="bookmark")
    listed = api.list_rv("parity=bookmark")
    filtered: list[dict] = []
    writer = threading.Timer(1.0, lambda: filtered.append(api.create_node("bookmark-b", parity="other")))
    writer.start()
    status, events, ended = api.watch([("resourceVersion", listed), ("labelSelector", "parity=bookmark"),
                                       ("allowWatchBookmarks", "true"), ("timeoutSeconds", 4)])
    writer.join()
    assert status == 200 and ended == "end" and filtered
    bookmarks = [e["object"] for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks and [e["type"] for e in events] == ["BOOKMARK"] * len(events)
    for bookmark in bookmarks:  # (the real one adds the kind's empty spec and status: nothing to read)
        assert (bookmark["kind"], bookmark["apiVersion"]) == ("Node", "v1")
        assert set(bookmark["metadata"]) == {"resourceVersion"}
    assert int(bookmarks[-1]["metadata"]["resourceVersion"]) >= int(filtered[0]["metadata"]["resourceVersion"])


def test_no_bookmark_repeats_what_the_watcher_has(api):
    """A bookmark no newer than the last event sent tells nothing: the real server sends none
    (the lab sent its revision every interval and before the timeout all the same)."""
    listed = api.list_rv("parity=quiet")
    api.create_node("quiet-a", parity="quiet")
    status, events, ended = api.watch([("resourceVersion", listed), ("labelSelector", "parity=quiet"),
                                       ("allowWatchBookmarks", "true"), ("timeoutSeconds", 4)])
    assert (status, ended) == (200, "end") and names(events) == [("ADDED", "quiet-a")]


def test_initial_events_end_with_an_annotated_bookmark(api):
    api.create_node("initial-a", parity="initial")
    api.create_node("initial-b", parity="initial")
    listed = api.list_rv("parity=initial")
    status, events, _ = api.watch(
        [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan"), ("resourceVersion", ""),
         ("allowWatchBookmarks", "true"), ("labelSelector", "parity=initial"), ("timeoutSeconds", 10)],
        until=lambda events: any(e["type"] == "BOOKMARK" for e in events))
    assert status == 200
    assert sorted(names(events[:-1])) == [("ADDED", "initial-a"), ("ADDED", "initial-b")]
    end = events[-1]
    assert end["type"] == "BOOKMARK"
    assert end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert set(end["object"]["metadata"]) == {"resourceVersion", "annotations"}
    assert int(end["object"]["metadata"]["resourceVersion"]) >= int(listed)


def test_list_resource_version_rules(api):
    api.create_node("rv-a", parity="rv")
    before = api.list_rv("parity=rv")
    api.create_node("rv-b", parity="rv")
    latest = api.list_rv("parity=rv")
    for version in ("0", ""):  # "0": any version, "": the latest; neither is older than a version already seen
        listed = api.ok("GET", query=[("resourceVersion", version), ("labelSelector", "parity=rv")])
        assert int(listed["metadata"]["resourceVersion"]) >= int(latest)
        assert sorted(i["metadata"]["name"] for i in listed["items"]) == ["rv-a", "rv-b"]
    whole = api.ok("GET", query=[("resourceVersion", "0"), ("limit", 1), ("labelSelector", "parity=rv")])
    assert len(whole["items"]) == 2 and not whole["metadata"].get("continue")  # "0" is not paged (the lab paged)
    exact = api.ok("GET", query=[("resourceVersion", before), ("resourceVersionMatch", "Exact"),
                                 ("labelSelector", "parity=rv")])
    assert exact["metadata"]["resourceVersion"] == before
    assert [i["metadata"]["name"] for i in exact["items"]] == ["rv-a"]
    newer = api.ok("GET", query=[("resourceVersion", before), ("resourceVersionMatch", "NotOlderThan"),
                                 ("labelSelector", "parity=rv")])
    assert int(newer["metadata"]["resourceVersion"]) >= int(latest) and len(newer["items"]) == 2
    # misused resourceVersionMatch: 422 Invalid on ListOptions (the lab said 400 BadRequest)
    for query, cause in (([("resourceVersionMatch", "NotOlderThan")], "FieldValueForbidden"),
                         ([("resourceVersion", "0"), ("resourceVersionMatch", "Exact")], "FieldValueForbidden"),
                         ([("resourceVersion", before), ("resourceVersionMatch", "Sometime")],
                          "FieldValueNotSupported")):
        status, refused = api.request("GET", query=query)
        assert (status, refused["reason"], refused["details"]["kind"]) == (422, "Invalid", "ListOptions"), refused
        assert [(c["field"], c["reason"]) for c in refused["details"]["causes"]] == [("resourceVersionMatch", cause)]
    status, too_new = api.request("GET", query=[("resourceVersion", str(int(latest) + 100000))])
    assert (status, too_new["reason"]) == (504, "Timeout")
    assert too_new["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"


def test_watch_option_rules(api):
    """resourceVersionMatch on a watch needs sendInitialEvents and the reverse; a list takes no
    sendInitialEvents: 422 Invalid on ListOptions (the lab took them all)."""
    for watch, query, field, cause in (
            (True, [("resourceVersionMatch", "NotOlderThan"), ("resourceVersion", "0")], "resourceVersionMatch",
             "FieldValueForbidden"),
            (True, [("sendInitialEvents", "true")], "resourceVersionMatch", "FieldValueForbidden"),
            (False, [("sendInitialEvents", "true")], "sendInitialEvents", "FieldValueForbidden")):
        status, refused = api.request("GET", query=[("watch", "true"), *query] if watch else query)
        assert (status, refused["reason"], refused["details"]["kind"]) == (422, "Invalid", "ListOptions"), refused
        assert [(c["field"], c["reason"]) for c in refused["details"]["causes"]] == [(field, cause)]


def test_a_watch_from_a_version_not_reached_yet_waits(api):
    """The real server holds the stream open for a revision it has not reached (the lab said 504)."""
    ahead = str(int(api.list_rv("parity=ahead")) + 100000)
    status, events, ended = api.watch([("resourceVersion", ahead), ("allowWatchBookmarks", "true"),
                                       ("timeoutSeconds", 2)])
    assert (status, events, ended) == (200, [], "end")


def test_an_unparsable_resource_version(api):
    """A list answers 400 BadRequest; a watch a bare 500 with no reason (the lab said 400)."""
    status, refused = api.request("GET", query=[("resourceVersion", "abc")])
    assert (status, refused["reason"]) == (400, "BadRequest") and 'Invalid value: "abc"' in refused["message"]
    status, events, how = api.watch([("resourceVersion", "abc")])
    assert (status, how) == (500, "refused")
    assert "reason" not in events[0] and 'Invalid value: "abc"' in events[0]["message"]


def test_paging_with_limit_and_continue(api):
    for name in ("page-a", "page-b", "page-c"):
        api.create_node(name, parity="page")
    query = [("labelSelector", "parity=page"), ("limit", 2)]
    first = api.ok("GET", query=query)
    assert [i["metadata"]["name"] for i in first["items"]] == ["page-a", "page-b"]
    token = first["metadata"]["continue"]
    assert "remainingItemCount" not in first["metadata"]  # not counted under a selector (the lab counted)
    api.create_node("page-d", parity="page")  # after the first page: not in this list
    second = api.ok("GET", query=[*query, ("continue", token)])
    assert [i["metadata"]["name"] for i in second["items"]] == ["page-c"]
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert not second["metadata"].get("continue")
    unfiltered = api.ok("GET", query=[("limit", 1)])
    assert unfiltered["metadata"]["remainingItemCount"] >= 3
    status, refused = api.request("GET", query=[*query, ("continue", token), ("resourceVersion", "5")])
    assert (status, refused["reason"]) == (400, "BadRequest")
    status, refused = api.request("GET", query=[*query, ("continue", "not-a-token")])
    assert (status, refused["reason"]) == (400, "BadRequest")


def test_selectors_on_a_watch(api):
    api.create_node("select-a", parity="select")
    api.create_node("select-b", parity="select")
    listed = api.list_rv("parity=select")
    merge = PatchType.MERGE
    api.ok("PATCH", NODES.object_path("select-b"), body={"metadata": {"labels": {"k": "1"}}}, patch=merge)
    api.ok("PATCH", NODES.object_path("select-a"), body={"metadata": {"labels": {"k": "1"}}}, patch=merge)
    api.ok("PATCH", NODES.object_path("select-b"), body={"metadata": {"labels": {"k": None}}}, patch=merge)
    api.ok("DELETE", NODES.object_path("select-a"))
    status, own, _ = api.watch([("resourceVersion", listed), ("fieldSelector", "metadata.name=select-a")],
                               until=lambda events: events[-1]["type"] == "DELETED")
    assert status == 200 and names(own) == [("MODIFIED", "select-a"), ("DELETED", "select-a")]
    status, labelled, _ = api.watch([("resourceVersion", listed), ("labelSelector", "parity=select,k=1")],
                                    until=lambda events: len(events) >= 4)
    # an object that starts matching arrives as ADDED, one that stops matching as DELETED
    assert names(labelled) == [("ADDED", "select-b"), ("ADDED", "select-a"), ("DELETED", "select-b"),
                               ("DELETED", "select-a")]
    status, refused = api.request("GET", query=[("fieldSelector", "spec.nothing=1")])
    assert (status, refused["reason"]) == (400, "BadRequest")


def test_status_patch_of_annotations_keeps_the_spec(api):
    """The agent announces itself with a merge patch of annotations on nodes/status."""
    api.create_node("status-a", parity="status")
    patched = patch_node_annotations(api.client, "status-a", {"netagent.io/a": "1", "netagent.io/b": "2"})
    assert patched["metadata"]["annotations"] == {"netagent.io/a": "1", "netagent.io/b": "2"}
    patched = patch_node_annotations(api.client, "status-a", {"netagent.io/a": None})
    assert patched["metadata"]["annotations"] == {"netagent.io/b": "2"}
    unchanged = patch_node_annotations(api.client, "status-a", {"netagent.io/b": "2"})
    assert unchanged["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]  # no write
    status_path = NODES.object_path("status-a") + "/status"
    spec_before = patched["spec"]
    patched = api.ok("PATCH", status_path, patch=PatchType.MERGE, body={
        "metadata": {"labels": {"from-status": "yes"}}, "spec": {"podCIDR": "10.9.0.0/24", "unschedulable": True}})
    assert patched["metadata"]["labels"] == {"parity": "status", "from-status": "yes"}  # metadata is the request's
    assert patched["spec"] == spec_before  # the spec is not
    patched = api.ok("PATCH", status_path, patch=PatchType.STRATEGIC,
                     body={"metadata": {"annotations": {"netagent.io/c": "3"}}})
    assert patched["metadata"]["annotations"] == {"netagent.io/b": "2", "netagent.io/c": "3"}
    main = api.ok("PATCH", NODES.object_path("status-a"), patch=PatchType.MERGE,
                  body={"status": {"capacity": {"cpu": "2"}}})
    assert "capacity" not in (main.get("status") or {})  # the main resource keeps the status
    status, missing = api.request("PATCH", NODES.object_path("status-none") + "/status", patch=PatchType.MERGE,
                                  body={"metadata": {"annotations": {"a": "b"}}})
    assert (status, missing["reason"]) == (404, "NotFound")


class Recorder:
    def __init__(self) -> None:
        self.names: set[str] = set()

    def on_add(self, obj: dict) -> None:
        self.names.add(obj["metadata"]["name"])

    def on_update(self, old: dict, new: dict) -> None:
        pass

    def on_delete(self, obj: dict) -> None:
        self.names.discard(obj["metadata"]["name"])

    def on_synced(self) -> None:
        pass


def wait_until(predicate: Callable[[], bool], *, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"not within {WAIT:.0f} s: {what}"
        time.sleep(0.1)


def test_a_restart_ends_watches_expires_old_versions_and_the_reflector_recovers(api):
    api.create_node("restart-a", parity="restart")
    old = api.list_rv("parity=restart")
    api.create_node("restart-b", parity="restart")
    before = api.list_rv("parity=restart")
    recorder = Recorder()
    reflector = Reflector(api_client=api.client, resource=NODES, handler=recorder, label_selector="parity=restart",
                          backoff=Backoff(initial=0.2, maximum=1.0), request_timeout=10.0)
    ended: list[str] = []
    watcher = threading.Thread(target=lambda: ended.append(api.watch(
        [("resourceVersion", before), ("labelSelector", "parity=restart"), ("timeoutSeconds", 120)],
        timeout=120)[2]), daemon=True)
    reflector.start()
    try:
        watcher.start()
        wait_until(lambda: recorder.names == {"restart-a", "restart-b"}, what="the reflector's first list")
        api.endpoint.restart()
        watcher.join(WAIT)
        assert ended and ended[0].startswith("error: ")  # the connection closed mid-body (the lab ended it cleanly)
        after = api.list_rv("parity=restart")
        assert int(after) >= int(before)
        # a version from before the restart is too old to watch from: a 200 with one ERROR event
        status, events, _ = api.watch([("resourceVersion", old), ("labelSelector", "parity=restart")])
        assert status == 200 and [e["type"] for e in events] == ["ERROR"]
        error = events[0]["object"]
        assert (error["kind"], error["code"], error["reason"]) == ("Status", 410, "Expired")
        assert re.fullmatch(rf"too old resource version: {old} \(\d+\)", error["message"]), error["message"]
        api.create_node("restart-c", parity="restart")
        api.ok("DELETE", NODES.object_path("restart-a"))
        wait_until(lambda: recorder.names == {"restart-b", "restart-c"}, what="the reflector after the restart")
    finally:
        reflector.stop()
