#!/usr/bin/env python3
"""Write throughput of the lab's API server: N Services, then N EndpointSlices, created one by
one over HTTP on loopback (each create is a POST the server validates against the OpenAPI
models, stores and answers), with the median latency per create; the first write is timed
apart (any one-time loading).

    .venv/bin/python bench/lab_apiserver.py [--objects 1000]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lab.apiserver import ApiServer  # noqa: E402


def post(url: str, body: dict) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


def service(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"svc-{i}", "namespace": "default"},
            "spec": {"selector": {"app": f"a{i}"}, "ports": [{"port": 80, "targetPort": 8080}]}}


def endpoint_slice(i: int) -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"svc-{i}-x", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": f"svc-{i}"}},
            "addressType": "IPv4", "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [f"10.244.{i // 250}.{i % 250 + 2}"], "conditions": {"ready": True}}]}


def measure(url: str, make, count: int) -> tuple[float, float]:
    latencies = []
    started = time.perf_counter()
    for i in range(count):
        t = time.perf_counter()
        post(url, make(i))
        latencies.append(time.perf_counter() - t)
    return count / (time.perf_counter() - started), statistics.median(latencies) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1000, help="how many of each kind to create")
    args = parser.parse_args()
    server = ApiServer()
    server.start()
    try:
        started = time.perf_counter()
        post(f"{server.url}/api/v1/namespaces/default/services", service(-1) | {"metadata": {"name": "warm-up"}})
        print(f"first write: {time.perf_counter() - started:.2f} s")
        for label, path, make in (
                ("Service", "/api/v1/namespaces/default/services", service),
                ("EndpointSlice", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", endpoint_slice)):
            rate, median_ms = measure(server.url + path, make, args.objects)
            print(f"{label:<14} {args.objects} creates: {rate:8.0f}/s, median {median_ms:.2f} ms per create")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
