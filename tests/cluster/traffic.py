"""Real traffic between lab namespaces: servers that report what they saw, clients that count.

Run as a program inside a namespace (`ip netns exec NS python -m tests.cluster.traffic ...`):

    serve-tcp PORT        echo every line back, prefixed with the peer address it came from
    serve-udp PORT        answer each datagram with "<peer address> <datagram>"
                          (both with `--name NAME`: answers start with "NAME ", to tell endpoints apart)
    ask-tcp ADDR PORT     one connection, one line; print the answer
    ask-udp ADDR PORT     one datagram; print the answer
    poll-tcp ADDR PORT COUNT       COUNT new connections in a row; print a JSON list, per
                          connection the answer or "error: ..." and the seconds it took
    stream-tcp ADDR PORT SECONDS   one long connection, a line every 20 ms for at most SECONDS; print
                          a JSON summary {"sent", "answered", "error"}: an established connection's fate
    stream-udp ADDR PORT SECONDS   one socket (one conntrack entry), a datagram every 50 ms for at
                          most SECONDS; print a JSON list of [seconds since start, answer] for every answer

Streams take `--ready` (print "ready" once the first answer came: the test knows the
connection is up before it changes anything) and end early on SIGTERM, still printing their
result: a test stops them after its change instead of guessing a duration that outlasts it on
a loaded machine. A TCP stream stopped so exchanges one more line first (the connection still
works at the end); `stream-udp --until NAME` ends by itself after 20 answers starting with NAME.

The servers exit after `--lifetime` seconds so a failed test can never leave them behind.
"""
from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
import time


def serve_tcp(port: int, lifetime: float, name: str = "") -> None:
    prefix = f"{name} ".encode() if name else b""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(64)
    print("ready", flush=True)

    def handle(conn: socket.socket, peer) -> None:
        with conn, conn.makefile("rwb") as stream:
            for line in stream:
                stream.write(prefix + f"{peer[0]} ".encode() + line)
                stream.flush()

    listener.settimeout(0.5)
    deadline = time.monotonic() + lifetime
    while time.monotonic() < deadline:
        try:
            conn, peer = listener.accept()
        except socket.timeout:
            continue
        threading.Thread(target=handle, args=(conn, peer), daemon=True).start()


def serve_udp(port: int, lifetime: float, name: str = "") -> None:
    prefix = f"{name} ".encode() if name else b""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", port))
    sock.settimeout(0.5)
    print("ready", flush=True)
    deadline = time.monotonic() + lifetime
    while time.monotonic() < deadline:
        try:
            data, peer = sock.recvfrom(65535)
        except socket.timeout:
            continue
        sock.sendto(prefix + f"{peer[0]} ".encode() + data, peer)


def ask_tcp(address: str, port: int, payload: str) -> str:
    with socket.create_connection((address, port), timeout=5) as conn, conn.makefile("rwb") as stream:
        stream.write(payload.encode() + b"\n")
        stream.flush()
        return stream.readline().decode().strip()


def ask_udp(address: str, port: int, payload: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(2)
        for _ in range(3):
            sock.sendto(payload.encode(), (address, port))
            try:
                return sock.recv(65535).decode().strip()
            except socket.timeout:
                continue
    raise TimeoutError(f"no UDP answer from {address}:{port}")


def stop_on_sigterm() -> threading.Event:
    """An event SIGTERM sets: the stream's cue to finish and print what it saw."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


def stream_tcp(address: str, port: int, seconds: float, *, ready: bool = False) -> dict:
    summary = {"sent": 0, "answered": 0, "error": None}
    stop = stop_on_sigterm()
    try:
        with socket.create_connection((address, port), timeout=5) as conn, conn.makefile("rwb") as stream:
            deadline = time.monotonic() + seconds
            while True:  # ends with an exchange: one made after the stop was asked for
                stream.write(f"{summary['sent']}\n".encode())
                stream.flush()
                summary["sent"] += 1
                if not stream.readline():
                    raise ConnectionError("the server closed the connection")
                summary["answered"] += 1
                if ready and summary["answered"] == 1:
                    print("ready", flush=True)
                if stop.is_set() or time.monotonic() >= deadline:
                    break
                stop.wait(0.02)
    except OSError as exc:
        summary["error"] = f"{type(exc).__name__}: {exc}"
    return summary


def poll_tcp(address: str, port: int, count: int, payload: str) -> list:
    results = []
    for _ in range(count):
        started = time.monotonic()
        try:
            answer = ask_tcp(address, port, payload)
        except OSError as exc:
            answer = f"error: {type(exc).__name__}: {exc}"
        results.append([answer, round(time.monotonic() - started, 3)])
    return results


def stream_udp(address: str, port: int, seconds: float, *, ready: bool = False, until: str = "") -> list:
    answers: list = []
    stop = stop_on_sigterm()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(0.05)
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < seconds and not stop.is_set():
            sock.sendto(f"{sent}".encode(), (address, port))
            sent += 1
            try:
                answers.append([round(time.monotonic() - started, 3), sock.recv(65535).decode().strip()])
            except OSError:  # timeout, or an ICMP error reported on the socket
                pass
            else:
                if ready and len(answers) == 1:
                    print("ready", flush=True)
                if until and sum(answer.startswith(until) for _, answer in answers) >= 20:
                    break
            stop.wait(0.05)
    return answers


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["serve-tcp", "serve-udp", "ask-tcp", "ask-udp", "poll-tcp", "stream-tcp",
                                           "stream-udp"])
    parser.add_argument("args", nargs="*")
    parser.add_argument("--lifetime", type=float, default=120)
    parser.add_argument("--payload", default="hello")
    parser.add_argument("--name", default="", help="servers: start every answer with this name")
    parser.add_argument("--ready", action="store_true", help="streams: print \"ready\" after the first answer")
    parser.add_argument("--until", default="", help="stream-udp: end after 20 answers starting with this")
    ns = parser.parse_args(argv)
    if ns.action == "serve-tcp":
        serve_tcp(int(ns.args[0]), ns.lifetime, ns.name)
    elif ns.action == "serve-udp":
        serve_udp(int(ns.args[0]), ns.lifetime, ns.name)
    elif ns.action == "ask-tcp":
        print(ask_tcp(ns.args[0], int(ns.args[1]), ns.payload))
    elif ns.action == "ask-udp":
        print(ask_udp(ns.args[0], int(ns.args[1]), ns.payload))
    elif ns.action == "poll-tcp":
        print(json.dumps(poll_tcp(ns.args[0], int(ns.args[1]), int(ns.args[2]), ns.payload)))
    elif ns.action == "stream-udp":
        print(json.dumps(stream_udp(ns.args[0], int(ns.args[1]), float(ns.args[2]), ready=ns.ready, until=ns.until)))
    else:
        print(json.dumps(stream_tcp(ns.args[0], int(ns.args[1]), float(ns.args[2]), ready=ns.ready)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
