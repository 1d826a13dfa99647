"""A TCP relay from the host's loopback into a lab namespace, for the real kube-apiserver.

The lab's own API server takes the host's listening socket as a file descriptor; the real
kube-apiserver cannot. This process is started inside the API server's namespace holding the
listening socket that `lab up` opened on the host's 127.0.0.1 (`--listen-fd`), and joins each
accepted connection to the API server's port in its own namespace: TLS passes through
untouched, and no route, address or iptables rule of the host changes.

    python -m lab.kubernetes.relay --listen-fd 3 --to 127.0.0.1:6443
"""
from __future__ import annotations

import argparse
import socket
import threading


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def _join(client: socket.socket, target: tuple[str, int]) -> None:
    try:
        upstream = socket.create_connection(target, timeout=10)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def serve(listener: socket.socket, target: tuple[str, int]) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_join, args=(client, target), daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--to", required=True, metavar="HOST:PORT")
    args = parser.parse_args()
    host, _, port = args.to.rpartition(":")
    serve(socket.socket(fileno=args.listen_fd), (host.strip("[]"), int(port)))


if __name__ == "__main__":
    main()
