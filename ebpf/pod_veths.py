"""The tc path on pod host veths (`--bpf-pod-veths`): for pods whose sockets the socket load
balancer does not see (their processes outside `--cgroup-root`).

Such a pod's connection to a cluster IP, NodePort, external or LB IP leaves it as a packet; it
enters the node on the pod's host veth, where `na_tc_from_pod` (ebpf/nodeport.c) translates it
to a backend of the cluster set, and the replies get the service address back at the veth's
egress (`na_tc_egress`). The host veths come and go with pods, so `PodVethAttacher` attaches
to every one there is at start and then to each new one. Pod veths are recognised by their
name, the CNI plugin's `na` + 12 hex digits (netagent/kernel/owned.py), never anything else.

When: a `SyncRunner` (`ebpf-pod-veths`, listed in the agent's /healthz) runs each rescan of
the links; a watcher thread only reads link notifications (RTM_NEWLINK, `LinkWatch`) and asks
the runner for a rescan per burst (a veth's creation brings several; an overrun, ENOBUFS, lost
some: a rescan covers them too). A veth the attach fails on fails the run, which the runner
retries; its periodic rescan covers a watcher that died. The subscription is made before the
first rescan, so no veth made meanwhile is missed; both, and the runner's thread, belong to the
network namespace of the thread that calls `start()`.

It holds its own duplicates of the two programs' descriptors (the loader's are closed after
loading) and closes them on `stop()`, once the runner has stopped (never under a running
attach); removing the filters is `detach_tc`'s, as for the underlay. The kernel is behind
`TcNetlink` (ebpf/tc.py) and `LinkWatch`; their fakes are in ebpf/fake_tc.py.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping

from ebpf.tc import NetlinkTc, TcNetlink, attach_tc
from netagent.errors import NetagentError
from netagent.infra.clock import Clock
from netagent.infra.sync_runner import SyncKind, SyncRunner
from netagent.kernel.owned import HOST_VETH_PREFIX

log = logging.getLogger("netagent.ebpf.pod_veths")

POD_VETH = re.compile(rf"^{HOST_VETH_PREFIX}[0-9a-f]{{12}}$")
FROM_POD = "na_tc_from_pod"
PROGRAMS = (FROM_POD, "na_tc_egress")   # what the loader keeps for the attacher
RTMGRP_LINK = 1
NETLINK_ROUTE = 0
WATCH_TIMEOUT = 0.5   # how long the watcher waits for notifications before it looks at stop()
RESCAN_INTERVAL = 30.0   # a full rescan at least this often, notifications or not
RETRY_INTERVAL = 5.0   # after a veth refused the tc path
START_TIMEOUT = 60.0


def is_pod_veth(name: str | None) -> bool:
    return bool(name) and POD_VETH.match(name or "") is not None


class LinkWatch(ABC):
    """Link notifications of the namespace it was opened in."""

    @abstractmethod
    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for notifications and read all there are; True if any."""

    @abstractmethod
    def close(self) -> None: ...


class NetlinkLinkWatch(LinkWatch):
    """A netlink socket subscribed to RTMGRP_LINK."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        try:
            self._socket.bind((0, RTMGRP_LINK))
        except BaseException:
            self._socket.close()
            raise

    def wait(self, timeout: float) -> bool:
        watch = self._socket
        watch.settimeout(timeout)
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
        return True

    def close(self) -> None:
        self._socket.close()


class AttachFailed(NetagentError):
    """A rescan left pod veths without the tc path (retried by the runner)."""


class PodVethAttacher:
    def __init__(self, fds: Mapping[str, int], *, netlink: TcNetlink | None = None,
                 watch: Callable[[], LinkWatch] = NetlinkLinkWatch, clock: Clock | None = None) -> None:
        self.fds = dict(fds)          # ours: closed by stop()
        self._netlink = netlink if netlink is not None else NetlinkTc()
        self._open_watch = watch
        self.attached: dict[int, str] = {}   # ifindex -> name, of the pod veths done (the runner's thread)
        self.runner = SyncRunner(name="ebpf-pod-veths", sync=self._sync, min_interval=0.0,
                                 max_interval=RESCAN_INTERVAL, retry_interval=RETRY_INTERVAL, clock=clock)
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self, *, timeout: float = START_TIMEOUT) -> None:
        """Subscribe, then have the runner attach to what exists (waiting for that first rescan:
        a veth it could not do yet is retried), then watch."""
        watch = self._open_watch()
        try:
            self.runner.start()
            self.runner.run_now_and_wait(timeout)
        except BaseException:
            watch.close()
            raise
        self._watcher = threading.Thread(target=self._watch, args=(watch,), name="bpf-pod-veths-watch",
                                         daemon=True)
        self._watcher.start()

    def stop(self, *, timeout: float = 30.0) -> bool:
        """Stop watching and rescanning; close our descriptors once no rescan can use them.
        False (descriptors left open) when a rescan is still running after `timeout`."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout)
            self._watcher = None
        if not self.runner.stop(timeout):
            log.error("pod veth rescan still running after %.0f s; its program descriptors stay open", timeout)
            return False
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}
        return True

    def rescan(self) -> list[str]:
        """Attach to every pod veth not done yet; forget the ones gone. The veths it could not
        do (gone meanwhile, or refused: the next run retries)."""
        with self._netlink as tc:
            present = tc.links()
        self.attached = {index: name for index, name in self.attached.items() if present.get(index) == name}
        failed = []
        for index, name in sorted(present.items()):
            if is_pod_veth(name) and index not in self.attached:
                try:
                    attach_tc(name, self.fds, ingress=FROM_POD, netlink=self._netlink)
                except Exception as error:
                    log.warning("attaching the tc path to pod veth %s: %s", name, error)
                    failed.append(name)
                    continue
                self.attached[index] = name
                log.debug("tc path attached to pod veth %s", name)
        return failed

    def _sync(self, kind: SyncKind) -> None:
        failed = self.rescan()
        if failed:
            raise AttachFailed(f"the tc path is not on {', '.join(failed[:5])} yet")

    def _watch(self, watch: LinkWatch) -> None:
        """Only reads notifications: each burst is one request for a rescan."""
        try:
            while not self._stop.is_set():
                if watch.wait(WATCH_TIMEOUT):
                    self.runner.request()
        except Exception:
            log.exception("watching for pod veths stopped; rescans continue every %.0f s", RESCAN_INTERVAL)
        finally:
            watch.close()
