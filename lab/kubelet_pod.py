"""One Pod's life on the lab's kubelet stand-in: a state machine over two seams, so it is tested on fakes.

`PodWorker` takes a Pod bound to its node from seeing it to its end, one `step` at a time, as a
kubelet's pod worker does: refuse what the stand-in cannot run (Failed, with why:
`kubelet_status.container_of`), report it Pending, wire its sandbox (the CNI ADD, retried while it
fails: the agent may not serve yet), start its container, report Running with its addresses,
Ready once its probe connects, and Succeeded or Failed by the exit code (`restartPolicy: Never`;
with `Always`, or `OnFailure` after a failure, the container is started again and its restarts
counted; `activeDeadlineSeconds` ends it as DeadlineExceeded). A deletion stops it whatever its
state: the container killed (SIGTERM, SIGKILL after the grace period), the sandbox's CNI DEL,
and after a graceful deletion the Pod deleted for good, as the kubelet finishes one.

What touches the machine is `PodRuntime` (the sandbox, the process, the probe: `kubelet.py`'s
`LabRuntime`) and what touches the API is `PodApi`; time is `Clock`. `run` is the thread's loop.
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from typing import Protocol

from lab import kubelet_status
from lab.kubelet_status import Container, Refused
from lab.pod_objects import now_rfc3339

_log = logging.getLogger("lab.kubelet")
SANDBOX_RETRY = 1.0          # seconds between CNI ADD attempts
RESTART_BACKOFF = (1.0, 2.0, 5.0, 10.0)
KILLED = 137                 # a container's exit code when the kubelet killed it (128 + SIGKILL)


class Process(Protocol):
    def poll(self) -> int | None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


class PodRuntime(Protocol):
    def add_network(self, pod: dict) -> list[str]: ...           # the pod's addresses, primary first
    def del_network(self, pod: dict) -> None: ...
    def start(self, pod: dict, container: Container, *, restarts: int) -> Process: ...
    def probe(self, address: str, port: int) -> bool: ...


class PodApi(Protocol):
    def patch_status(self, namespace: str, name: str, patch: dict) -> None: ...
    def delete_pod(self, namespace: str, name: str) -> None: ...


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class Phase(enum.Enum):
    NEW = "new"
    SANDBOX = "sandbox"        # waiting for its network
    RUNNING = "running"
    ENDED = "ended"            # a terminal phase reported; the sandbox kept until the Pod goes
    GONE = "gone"              # torn down: the worker is finished


class PodWorker:
    """One Pod (by uid) on this node. `deleted` may be called from any thread; the rest from `run`'s."""

    def __init__(self, pod: dict, *, runtime: PodRuntime, api: PodApi, host_ip: str,
                 clock: Clock = time) -> None:
        self.pod = pod
        self.runtime = runtime
        self.api = api
        self.host_ip = host_ip
        self.clock = clock
        meta = pod.get("metadata") or {}
        self.namespace, self.name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        self.phase = Phase.NEW
        self.container: Container | None = None
        self.process: Process | None = None
        self.addresses: list[str] = []
        self.networked = False
        self.ready = False
        self.restarts = 0
        self.started_at = ""
        self.started = 0.0
        self.container_id = f"lab-{str(meta.get('uid', ''))[:24]}"
        self.next_try = 0.0
        self.last_error = ""
        self._deletion: tuple[bool, float] | None = None   # (graceful?, grace seconds)
        self._lock = threading.Lock()
        self.wakeup = threading.Event()

    def deleted(self, *, graceful: bool, grace: float = 0.0) -> None:
        """The Pod was deleted (`graceful`: marked, it waits for us; else it is already gone)."""
        with self._lock:
            if self._deletion is None or not graceful:
                self._deletion = (graceful, grace)
        self.wakeup.set()

    def _patch(self, patch: dict) -> None:
        try:
            self.api.patch_status(self.namespace, self.name, patch)
        except Exception as error:   # the Pod may be gone already: its deletion event follows
            _log.info("pod %s/%s: status not written: %s", self.namespace, self.name, error)

    def step(self) -> None:
        """One transition (or none, when nothing is due)."""
        with self._lock:
            deletion = self._deletion
        if deletion is not None and self.phase is not Phase.GONE:
            return self._teardown(graceful=deletion[0], grace=deletion[1])
        if self.phase is Phase.NEW:
            try:
                self.container = kubelet_status.container_of(self.pod)
            except Refused as error:
                self.phase = Phase.ENDED
                return self._patch(kubelet_status.refused(str(error)))
            self.phase = Phase.SANDBOX
            return self._patch(kubelet_status.pending(self.container))
        if self.phase is Phase.SANDBOX and self.clock.monotonic() >= self.next_try:
            return self._sandbox()
        if self.phase is Phase.RUNNING:
            return self._watch()

    def _sandbox(self) -> None:
        assert self.container is not None
        try:
            if not self.networked:
                self.addresses = self.runtime.add_network(self.pod)
                self.networked = True
            self.started_at = now_rfc3339()
            self.started = self.clock.monotonic()
            self.process = self.runtime.start(self.pod, self.container, restarts=0)
        except Exception as error:
            self.next_try = self.clock.monotonic() + SANDBOX_RETRY
            message = f"{type(error).__name__}: {error}"
            if message != self.last_error:   # one report per distinct failure, not one a second
                self.last_error = message
                _log.warning("pod %s/%s: %s", self.namespace, self.name, message)
                self._patch(kubelet_status.pending(self.container, message=message))
            return
        self.phase = Phase.RUNNING
        self.ready = self.container.probe_port is None
        self._report_running()

    def _report_running(self) -> None:
        assert self.container is not None
        self._patch(kubelet_status.running(self.container, pod_ips=self.addresses, host_ip=self.host_ip,
                                           container_id=self.container_id, ready=self.ready,
                                           started_at=self.started_at, restarts=self.restarts))

    def _watch(self) -> None:
        assert self.container is not None and self.process is not None
        spec = self.pod.get("spec") or {}
        code = self.process.poll()
        if code is None:
            deadline = spec.get("activeDeadlineSeconds")
            if isinstance(deadline, int) and self.clock.monotonic() - self.started > deadline:
                self.process.kill()
                self.phase = Phase.ENDED
                return self._patch(kubelet_status.terminated(
                    self.container, exit_code=KILLED, container_id=self.container_id, started_at=self.started_at,
                    reason="DeadlineExceeded", message=f"Pod was active on the node longer than {deadline} s"))
            port = self.container.probe_port
            if not self.ready and port is not None and self.addresses and self.runtime.probe(self.addresses[0], port):
                self.ready = True
                self._report_running()
            return
        policy = spec.get("restartPolicy") or "Always"
        if policy == "Never" or (policy == "OnFailure" and code == 0):
            self.phase = Phase.ENDED
            return self._patch(kubelet_status.terminated(self.container, exit_code=code,
                                                         container_id=self.container_id, started_at=self.started_at))
        backoff = RESTART_BACKOFF[min(self.restarts, len(RESTART_BACKOFF) - 1)]
        self.restarts += 1
        self.ready = False
        self.phase = Phase.SANDBOX      # started again (the network kept) once the backoff is over
        self.next_try = self.clock.monotonic() + backoff
        self._report_running()

    def _teardown(self, *, graceful: bool, grace: float) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            deadline = self.clock.monotonic() + (grace if graceful else 0.0)
            while process.poll() is None and self.clock.monotonic() < deadline:
                self.clock.sleep(0.05)
            if process.poll() is None:
                process.kill()
                deadline = self.clock.monotonic() + 5.0
                while process.poll() is None and self.clock.monotonic() < deadline:   # reaped: no zombie
                    self.clock.sleep(0.02)
        if self.networked:
            try:
                self.runtime.del_network(self.pod)
            except Exception as error:
                _log.warning("pod %s/%s: CNI DEL failed: %s", self.namespace, self.name, error)
            self.networked = False
        self.phase = Phase.GONE
        if graceful:
            try:
                self.api.delete_pod(self.namespace, self.name)
            except Exception as error:
                _log.info("pod %s/%s: not deleted: %s", self.namespace, self.name, error)

    def run(self, *, poll: float = 0.2) -> None:
        """The worker's thread: step until torn down."""
        while self.phase is not Phase.GONE:
            try:
                self.step()
            except Exception:
                _log.exception("pod %s/%s: worker step failed", self.namespace, self.name)
            if self.phase is not Phase.GONE:
                self.wakeup.wait(poll)
                self.wakeup.clear()
