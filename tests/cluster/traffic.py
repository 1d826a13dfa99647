"""Real traffic between lab namespaces: servers that report what they saw, clients that count.

Run as a program inside a namespace (`ip netns exec NS python -m tests.cluster.traffic ...`):

    serve-tcp PORT        echo every line back, prefixed with the peer address it came from
    serve-udp PORT        answer each datagram with "<peer address> <datagram>"
    ask-tcp ADDR PORT     one connection, one line; print the answer
    ask-udp ADDR PORT     one datagram; print the answer
    stream-tcp ADDR PORT SECONDS   one long connection, a line every 20 ms for SECONDS; print a JSON
                          summary {"sent", "answered", "error"}: an established connection's fate

The servers exit after `--lifetime` seconds so a failed test can never leave them behind.
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time


def serve_tcp(port: int, lifetime: float) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(64)
    print("ready", flush=True)

    def handle(conn: socket.socket, peer) -> None:
        with conn, conn.makefile("rwb") as stream:
            for line in stream:
                stream.write(f"{peer[0]} ".encode() + line)
                stream.flush()

    listener.settimeout(0.5)
    deadline = time.monotonic() + lifetime
    while time.monotonic() < deadline:
        try:
            conn, peer = listener.accept()
        except socket.timeout:
            continue
        threading.Thread(target=handle, args=(conn, peer), daemon=True).start()


def serve_udp(port: int, lifetime: float) -> None:
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
        sock.sendto(f"{peer[0]} ".encode() + data, peer)


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


def stream_tcp(address: str, port: int, seconds: float) -> dict:
    summary = {"sent": 0, "answered": 0, "error": None}
    try:
        with socket.create_connection((address, port), timeout=5) as conn, conn.makefile("rwb") as stream:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                stream.write(f"{summary['sent']}\n".encode())
                stream.flush()
                summary["sent"] += 1
                if not stream.readline():
                    raise ConnectionError("the server closed the connection")
                summary["answered"] += 1
                time.sleep(0.02)
    except OSError as exc:
        summary["error"] = f"{type(exc).__name__}: {exc}"
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["serve-tcp", "serve-udp", "ask-tcp", "ask-udp", "stream-tcp"])
    parser.add_argument("args", nargs="*")
    parser.add_argument("--lifetime", type=float, default=120)
    parser.add_argument("--payload", default="hello")
    ns = parser.parse_args(argv)
    if ns.action == "serve-tcp":
        serve_tcp(int(ns.args[0]), ns.lifetime)
    elif ns.action == "serve-udp":
        serve_udp(int(ns.args[0]), ns.lifetime)
    elif ns.action == "ask-tcp":
        print(ask_tcp(ns.args[0], int(ns.args[1]), ns.payload))
    elif ns.action == "ask-udp":
        print(ask_udp(ns.args[0], int(ns.args[1]), ns.payload))
    else:
        print(json.dumps(stream_tcp(ns.args[0], int(ns.args[1]), float(ns.args[2]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
