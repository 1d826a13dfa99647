"""Health-check node ports are bounded (issue 29, item 11): a limit on listeners, one thread for
all of them whatever the number of ports or connections, and a deadline on request heads.

Real sockets on loopback against `proxy/healthcheck.py`'s `HealthCheckPorts`, the object the
agent builds (`--proxy-max-health-check-ports` through `proxy/limits.py`).
"""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from proxy.healthcheck import HealthCheckAnswer, HealthCheckPorts
from proxy.limits import ProxyLimits, add_limit_arguments, limits_from_args
from tests.unit.proxy.test_service_proxy import fetch, free_port


def free_ports(count: int) -> list[int]:
    found: list[int] = []
    holders = []
    try:
        while len(found) < count:
            port = free_port()
            holder = socket.socket()
            holder.bind(("127.0.0.1", port))   # so the next free_port() finds another
            holders.append(holder)
            found.append(port)
    finally:
        for holder in holders:
            holder.close()
    return sorted(found)


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def answer(name: str, count: int = 1) -> HealthCheckAnswer:
    return HealthCheckAnswer("default", name, count)


def test_the_number_of_listeners_is_bounded_and_open_ones_stay_open():
    ports = HealthCheckPorts(bind_address="127.0.0.1", max_ports=3)
    try:
        wanted = free_ports(5)
        ports.sync({port: answer(f"lb{i}") for i, port in enumerate(wanted[1:])})   # four wanted, three served
        assert set(ports.ports()) == set(wanted[1:4]) and ports.refused == {wanted[4]}
        # a lower port arriving later does not push an open one out
        ports.sync({port: answer(f"lb{i}") for i, port in enumerate(wanted)})
        assert set(ports.ports()) == set(wanted[1:4]) and ports.refused == {wanted[0], wanted[4]}
        with pytest.raises(OSError):
            fetch(wanted[0])
        assert fetch(wanted[2])[0] == 200
        ports.sync({wanted[0]: answer("lb0")})   # room made: served
        assert set(ports.ports()) == {wanted[0]} and ports.refused == frozenset()
        assert fetch(wanted[0])[1]["service"] == {"namespace": "default", "name": "lb0"}
    finally:
        ports.close()


def test_many_ports_and_connections_are_served_by_one_thread():
    before = threading.active_count()
    ports = HealthCheckPorts(bind_address="127.0.0.1")
    try:
        wanted = free_ports(20)
        ports.sync({port: answer(f"lb{i}", i) for i, port in enumerate(wanted)})
        assert ports.threads() == 1
        idle = [socket.create_connection(("127.0.0.1", port)) for port in wanted for _ in range(3)]
        try:
            assert threading.active_count() <= before + 1
            status, body = fetch(wanted[5])
            assert (status, body["localEndpoints"], body["service"]["name"]) == (200, 5, "lb5")
            assert fetch(wanted[0])[0] == 503
        finally:
            for conn in idle:
                conn.close()
        assert threading.active_count() <= before + 1
    finally:
        ports.close()


def test_a_client_that_never_sends_its_head_is_dropped_at_the_deadline_and_others_are_served():
    ports = HealthCheckPorts(bind_address="127.0.0.1", head_deadline=0.5)
    port = free_ports(1)[0]
    try:
        ports.sync({port: answer("lb")})
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")   # never the blank line
        slow.settimeout(30)
        assert fetch(port)[0] == 200   # served while the slow one waits
        started = time.monotonic()
        assert slow.recv(100) == b""   # closed by the agent, unanswered
        assert time.monotonic() - started < 10 and ports.dropped_deadline >= 1
        slow.close()
    finally:
        ports.close()


def test_the_oldest_waiting_connection_makes_room_past_the_bound():
    ports = HealthCheckPorts(bind_address="127.0.0.1", max_connections=4)
    port = free_ports(1)[0]
    try:
        ports.sync({port: answer("lb")})
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]
        try:
            wait_for(lambda: ports.dropped_oldest >= 6)
            assert fetch(port)[0] == 200
        finally:
            for conn in idle:
                conn.close()
    finally:
        ports.close()


def test_the_answer_is_kube_proxys_json_and_follows_sync_without_rebinding():
    ports = HealthCheckPorts(bind_address="127.0.0.1", proxy_healthy=lambda: False)
    port = free_ports(1)[0]
    try:
        ports.sync({port: answer("lb", 2)})
        assert fetch(port) == (200, {"service": {"namespace": "default", "name": "lb"}, "localEndpoints": 2,
                                     "serviceProxyHealthy": False})
        with socket.create_connection(("127.0.0.1", port)) as raw:
            raw.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n\r\n")
            raw.settimeout(30)
            reply = b""
            while chunk := raw.recv(4096):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 405") and json.loads(reply.split(b"\r\n\r\n", 1)[1])
        ports.sync({port: answer("lb", 0)})
        assert fetch(port)[0] == 503
    finally:
        ports.close()


def test_the_limit_is_a_flag_sized_from_the_default_nodeport_range():
    import argparse
    parser = argparse.ArgumentParser()
    add_limit_arguments(parser)
    assert ProxyLimits().health_check_ports == 32767 - 30000 + 1
    args = parser.parse_args(["--proxy-max-health-check-ports", "10"])
    assert limits_from_args(args).health_check_ports == 10
