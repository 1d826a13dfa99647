#!/usr/bin/env python3
"""What the agent's watch layer costs, beside the official Python client doing the same work,
against the lab API server on loopback:

- the initial list of N Nodes in pages of 500, until the reflector says synced (store filled,
  every add delivered), against the official client's paged `list_node` into its models;
- watch latency: 300 Nodes created one by one, each timed from just before its POST until the
  reflector's handler sees it, and until `kubernetes.watch.Watch().stream(list_node)`, watching
  at the same time, sees it.

    .venv/bin/python bench/reflector.py [--nodes 10000] [--events 300]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kubernetes import client, watch  # noqa: E402

from lab.apiserver import ApiServer  # noqa: E402
from netagent.kube.config import request_json  # noqa: E402
from netagent.kube.reflector import Reflector  # noqa: E402
from netagent.kube.resources import NODES  # noqa: E402

PAGE = 500


class Arrivals:
    """Handler that stamps when each object's add arrives."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self.changed = threading.Condition()

    def note(self, name: str) -> None:
        with self.changed:
            self.seen[name] = time.perf_counter()
            self.changed.notify_all()

    def on_add(self, obj: dict) -> None:
        self.note(obj["metadata"]["name"])

    def on_update(self, old: dict, new: dict) -> None:
        pass

    def on_delete(self, obj: dict) -> None:
        pass

    def on_synced(self) -> None:
        pass

    def wait(self, name: str) -> float:
        with self.changed:
            if not self.changed.wait_for(lambda: name in self.seen, 30):
                raise TimeoutError(f"{name} never arrived")
            return self.seen[name]


def list_with_reflector(url: str, count: int) -> float:
    api = client.ApiClient(client.Configuration(host=url))
    reflector = Reflector(api_client=api, resource=NODES, handler=Arrivals(), page_size=PAGE)
    started = time.perf_counter()
    reflector.start()
    try:
        if not reflector.synced.wait(300) or len(reflector.store) != count:
            raise RuntimeError("the reflector did not list every node")
        return time.perf_counter() - started
    finally:
        reflector.stop()
        api.close()


def list_with_official_client(url: str, count: int) -> float:
    with client.ApiClient(client.Configuration(host=url)) as api:
        core = client.CoreV1Api(api)
        started = time.perf_counter()
        items, token = [], None
        while True:
            page = core.list_node(limit=PAGE, _continue=token)
            items.extend(page.items)
            token = page.metadata._continue
            if not token:
                break
        if len(items) != count:
            raise RuntimeError("the official client did not list every node")
        return time.perf_counter() - started


def official_watcher(url: str, arrivals: Arrivals, stop: threading.Event, resource_version: str) -> None:
    with client.ApiClient(client.Configuration(host=url)) as api:
        core = client.CoreV1Api(api)
        watcher = watch.Watch()
        for event in watcher.stream(core.list_node, resource_version=resource_version, timeout_seconds=600):
            if event["type"] == "ADDED":
                arrivals.note(event["object"].metadata.name)
            if stop.is_set():
                watcher.stop()


def watch_latencies(url: str, events: int) -> tuple[list[float], list[float]]:
    ours, theirs = Arrivals(), Arrivals()
    api = client.ApiClient(client.Configuration(host=url))
    reflector = Reflector(api_client=api, resource=NODES, handler=ours)
    reflector.start()
    stop = threading.Event()
    try:
        if not reflector.synced.wait(300):
            raise RuntimeError("the reflector did not sync")
        thread = threading.Thread(target=official_watcher, daemon=True,
                                  args=(url, theirs, stop, reflector.last_resource_version))
        thread.start()
        time.sleep(1.0)  # let the official client's watch connect (it reports nothing when it has)
        ours_ms, theirs_ms = [], []
        with client.ApiClient(client.Configuration(host=url)) as writer:
            for index in range(events):
                name = f"latency-{index}"
                sent = time.perf_counter()
                request_json(writer, "POST", NODES.list_path(), body={"metadata": {"name": name}})
                ours_ms.append((ours.wait(name) - sent) * 1000)
                theirs_ms.append((theirs.wait(name) - sent) * 1000)
        stop.set()
        return ours_ms, theirs_ms
    finally:
        reflector.stop()
        api.close()


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    return f"median {statistics.median(ordered):6.2f} ms, p95 {ordered[int(len(ordered) * 0.95)]:6.2f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--events", type=int, default=300)
    args = parser.parse_args()
    server = ApiServer()
    server.start()
    try:
        for index in range(args.nodes):
            server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{index:05d}"},
                           "spec": {"podCIDR": f"10.{index // 256 % 256}.{index % 256}.0/24"}})
        ours = list_with_reflector(server.url, args.nodes)
        theirs = list_with_official_client(server.url, args.nodes)
        print(f"list {args.nodes} nodes in pages of {PAGE}: reflector {ours:.2f} s (store filled, handler called), "
              f"official client list_node {theirs:.2f} s; ratio {theirs / ours:.1f}x")
        ours_ms, theirs_ms = watch_latencies(server.url, args.events)
        print(f"watch, create -> seen, {args.events} events: reflector {summary(ours_ms)}")
        print(f"{'':>37}official Watch.stream {summary(theirs_ms)}; "
              f"median ratio {statistics.median(theirs_ms) / statistics.median(ours_ms):.1f}x")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
