"""The demo's Service act: every pod serves its name, one pod connects to a ClusterIP.

A Service without a selector plus its EndpointSlice listing every demo pod (what a user
writes for endpoints they manage), so the demo does not depend on pod labels. Each pod runs
a one-line TCP server answering with its name; the first pod then opens a new connection
to the Service's cluster IP, five per endpoint, and the demo prints which pods answered:
the node agents' service proxy spreads them at random over pods on every node (a pod may
reach itself: hairpin). Only a failed connection fails the demo; the spread is random.
In a lab with IPv6 (`--ip-family ipv6|dual`) the Service is `PreferDualStack`, with a slice
per family, the servers listen on both families and the client connects to every cluster IP.
"""
from __future__ import annotations

import collections
import subprocess
import sys
import time

from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily

PORT = 8080
_SERVER = ("import socket,sys\n"
           "s=(socket.create_server(('::',%d),family=socket.AF_INET6,dualstack_ipv6=True) if sys.argv[2:] "
           "else socket.create_server(('0.0.0.0',%d)));s.settimeout(60)\n"
           "while True:\n"
           "    c,_=s.accept();c.sendall(sys.argv[1].encode());c.close()\n") % (PORT, PORT)
_CLIENT = ("import socket,sys,time\n"
           "deadline=time.monotonic()+15\n"
           "for _ in range(int(sys.argv[2])):\n"
           "    while True:\n"
           "        try:\n"
           "            with socket.create_connection((sys.argv[1],80),timeout=2) as c: print(c.recv(100).decode())\n"
           "            break\n"
           "        except OSError as e:\n"
           "            if time.monotonic()>deadline: print('error',e); break\n"
           "            time.sleep(0.2)\n")


def demo_service(lab) -> int:
    """Run the act and print it; answers the number of failed connections."""
    pods = list(lab.state.pods.values())
    ipv6 = IpFamily.V6 in lab.state.families
    servers = [subprocess.Popen([*namespaces.exec_prefix(pod.netns), sys.executable, "-c", _SERVER, pod.name,
                                 *(["dual"] if ipv6 else [])],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pod in pods]
    failed = 0
    try:
        api = lab.api()
        spec: dict = {"ports": [{"name": "http", "port": 80, "targetPort": PORT}]}
        if ipv6:
            spec["ipFamilyPolicy"] = "PreferDualStack"
        service = api.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "demo", "namespace": "default"},
                             "spec": spec})
        for family in lab.state.families:
            suffix = "1" if family is IpFamily.V4 else "v6"   # IPv4's slice keeps its name
            api.apply({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                       "metadata": {"name": f"demo-{suffix}", "namespace": "default",
                                    "labels": {"kubernetes.io/service-name": "demo"}},
                       "addressType": family.label, "ports": [{"name": "http", "port": PORT, "protocol": "TCP"}],
                       "endpoints": [{"addresses": [ip], "nodeName": pod.node, "conditions": {"ready": True}}
                                     for pod in pods for ip in pod.ips or [pod.ip] if IpFamily.of(ip) is family]})
        time.sleep(1.5)  # the agents' minimum sync interval
        for cluster_ip in service["spec"].get("clusterIPs") or [service["spec"]["clusterIP"]]:
            failed += _connect(lab, pods, cluster_ip)
        return failed
    finally:
        for server in servers:
            server.kill()
            server.wait()


def _connect(lab, pods: list, cluster_ip: str) -> int:
    """Connections from the first pod to `cluster_ip`:80, printed; answers how many failed."""
    answers = lab.exec(pods[0].name, [sys.executable, "-c", _CLIENT, cluster_ip, str(5 * len(pods))],
                       timeout=60).stdout.split("\n")
    answers = [a for a in answers if a]
    failed = sum(1 for a in answers if a.startswith("error"))
    counts = collections.Counter(a for a in answers if not a.startswith("error"))
    where = f"[{cluster_ip}]:80" if ":" in cluster_ip else f"{cluster_ip}:80"
    print(f"  service default/demo {where} -> {len(pods)} pods; {len(answers)} connections from "
          f"{pods[0].name}:")
    for pod in pods:
        print(f"    {pod.name:<16} on {pod.node:<8} answered {counts.get(pod.name, 0)}")
    if failed:
        print(f"    {failed} connection(s) FAILED")
    return failed
