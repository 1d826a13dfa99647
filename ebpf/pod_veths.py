"""The tc path on pod host veths (`--bpf-pod-veths`): for pods whose sockets the socket load
balancer does not see (their processes outside `--cgroup-root`).

Such a pod's connection to a cluster IP, NodePort, external or LB IP leaves it as a packet; it
enters the node on the pod's host veth, where `na_tc_from_pod` (ebpf/nodeport.c) translates it
to a backend of the cluster set, and the replies get the service address back at the veth's
egress (`na_tc_egress`). The host veths come and go with pods, so `PodVethAttacher` attaches
to every one there is at start and then to each new one, watching link notifications
(RTM_NEWLINK) in a thread of its own: each burst of them is one rescan of the links. Pod
veths are recognised by their name, the CNI plugin's `na` + 12 hex digits
(netagent/kernel/owned.py), never anything else. It holds its own
duplicates of the two programs' descriptors (the loader's are closed after loading) and closes
them on `stop()`; removing the filters is `detach_tc`'s, as for the underlay.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Mapping

from netagent.kernel.owned import HOST_VETH_PREFIX

log = logging.getLogger("netagent.ebpf.pod_veths")

POD_VETH = re.compile(rf"^{HOST_VETH_PREFIX}[0-9a-f]{{12}}$")
FROM_POD = "na_tc_from_pod"
PROGRAMS = (FROM_POD, "na_tc_egress")   # what the loader keeps for the attacher
RTMGRP_LINK = 1
NETLINK_ROUTE = 0


def is_pod_veth(name: str | None) -> bool:
    return bool(name) and POD_VETH.match(name or "") is not None


class PodVethAttacher:
    def __init__(self, fds: Mapping[str, int], *,
                 attach: Callable[[str, Mapping[str, int]], None] | None = None) -> None:
        self.fds = dict(fds)          # ours: closed by stop()
        self._attach = attach or _attach_from_pod
        self.attached: dict[int, str] = {}   # ifindex -> name, of the pod veths done
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Subscribe first, then attach to what exists, so no veth made meanwhile is missed.
        The subscription and the thread belong to the caller's network namespace."""
        watch = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        try:
            watch.bind((0, RTMGRP_LINK))
            watch.settimeout(0.5)
            self.rescan()
        except BaseException:
            watch.close()
            raise
        self._thread = threading.Thread(target=self._run, args=(watch,), name="bpf-pod-veths", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}

    def rescan(self) -> None:
        """Attach to every pod veth not done yet; forget the ones gone."""
        from pyroute2 import IPRoute
        with IPRoute() as ipr:
            present = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        self.attached = {index: name for index, name in self.attached.items() if present.get(index) == name}
        for index, name in sorted(present.items()):
            if is_pod_veth(name) and index not in self.attached:
                try:
                    self._attach(name, self.fds)
                except Exception as error:   # a veth gone meanwhile; the next notification retries
                    log.warning("attaching the tc path to pod veth %s: %s", name, error)
                    continue
                self.attached[index] = name
                log.debug("tc path attached to pod veth %s", name)

    def _run(self, watch: socket.socket) -> None:
        """Each burst of link notifications (a veth's creation brings several) is one rescan;
        the notifications themselves are only read to empty the socket (an overrun, ENOBUFS,
        lost some: a rescan covers them too)."""
        try:
            while not self._stop.is_set():
                if _drained(watch):
                    self.rescan()
        except Exception:
            log.exception("watching for pod veths stopped")
        finally:
            watch.close()


def _drained(watch: socket.socket) -> bool:
    """Wait up to the socket's timeout for notifications and read all there are; True if any."""
    try:
        watch.recv(65536)
    except socket.timeout:
        return False
    except OSError as error:
        if error.errno != errno.ENOBUFS:
            raise
    watch.setblocking(False)
    try:
        while True:
            watch.recv(65536)
    except BlockingIOError:
        pass
    except OSError as error:
        if error.errno != errno.ENOBUFS:
            raise
    finally:
        watch.settimeout(0.5)
    return True


def _attach_from_pod(device: str, fds: Mapping[str, int]) -> None:
    from ebpf.tc import attach_tc
    attach_tc(device, fds, ingress=FROM_POD)
