"""`python -m lab.apiserver`: the API test server as a process, as the lab runs it.

The lab starts it in the router namespace with `--listen`, `--unix`, `--state`,
`--endpointslice-controller`, `--endpoints-controller` (v1 Endpoints mirrored from the
slices), `--service-cidr` (one range per family, comma-separated), `--advertise` (the `default/kubernetes` Service) and `--listen-fd` (a loopback
socket `lab up` opened in its own namespace, so kubectl on the host reaches the same
process); the tests start it the same way to kill it mid-write. It prints `listening URL`
once it serves, serves until SIGTERM or SIGINT, then stops the controllers and then the
server (which saves the state). The help text is the package
docstring's first line. The EndpointSlice controller is imported only when asked for.
"""
from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading

import lab.apiserver as package
from lab.apiserver.endpoints_mirror import EndpointsMirror
from lab.apiserver.server import ApiServer


def _parse_listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, not {text!r}")
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> int:
    description = (package.__doc__ or "").partition("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m lab.apiserver", description=description)
    parser.add_argument("--listen", type=_parse_listen, default=("127.0.0.1", 0), metavar="HOST:PORT")
    parser.add_argument("--unix", metavar="PATH", help="also listen on this unix socket")
    parser.add_argument("--listen-fd", type=int, action="append", default=[], metavar="FD",
                        help="also serve this inherited, already listening TCP socket (repeatable)")
    parser.add_argument("--advertise", type=_parse_listen, metavar="ADDRESS:PORT",
                        help="publish the default/kubernetes Service with this endpoint, as a real server does")
    parser.add_argument("--service-cidr", default="10.96.0.0/16", metavar="CIDR[,CIDR]",
                        help="the Service range, or one per family for dual stack (the primary family first)")
    parser.add_argument("--state", metavar="FILE", help="persist objects and the resourceVersion here")
    parser.add_argument("--bookmark-interval", type=float, default=5.0, metavar="SECONDS")
    parser.add_argument("--history", type=int, default=10000, metavar="EVENTS")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--endpointslice-controller", action="store_true",
                        help="also run the lab's EndpointSlice controller (slices for Services with selectors)")
    parser.add_argument("--endpoints-controller", action="store_true",
                        help="also keep v1 Endpoints for selector Services, mirrored from their EndpointSlices")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.set())
    signal.signal(signal.SIGINT, lambda *_: stop_requested.set())
    server = ApiServer(state_file=args.state, history=args.history, bookmark_interval=args.bookmark_interval,
                       advertise=args.advertise, service_cidr=args.service_cidr)
    host, port = args.listen
    controller = None
    if args.endpointslice_controller:
        from lab.endpointslice_controller import EndpointSliceController  # only when asked for

        controller = EndpointSliceController(server.store)
        controller.start()  # before serving: its start-up sync sees the state as loaded
    handed = tuple(socket.socket(fileno=fd) for fd in args.listen_fd)
    mirror = EndpointsMirror(server.store) if args.endpoints_controller else None
    if mirror is not None:
        mirror.start()
    server.start(host=host, port=port, unix_path=args.unix, listening=handed)
    print(f"listening {server.url}", flush=True)
    while not stop_requested.wait(0.5):
        pass
    if controller is not None:
        controller.stop()
    if mirror is not None:
        mirror.stop()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
