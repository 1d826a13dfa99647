"""Finishing CNI DELs after the reply, behind a journal: the agent's answer to veth teardown.

Deleting a veth costs about 16 ms of kernel time (an RCU grace period in
`unregister_netdevice`), from either end, and nothing in user space makes it shorter. The
runtime does not need to wait for it: once a DEL is validated and written to the journal,
the agent replies and a worker thread finishes the job: the veth first, then the IPAM
release, so an address is never handed out while the old veth still holds it. An ADD
for the same attachment waits for its pending DEL; GC waits for all of them.

The journal (one small JSON file per pending DEL, next to the agent's socket) is what
makes the early reply safe: an agent killed with DELs pending replays them at start.
It lives on tmpfs (/run) in production and needs no fsync: it has to survive the agent,
not the machine, and after a reboot the veths are gone anyway.

The CNI shim (cni/shim/journal.c) writes here too: a DEL that finds no agent
listening is saved as its wire-format request (`shim-<time>-<pid>.wire`, cni/wire.py's
framing) and acknowledged. `adopt_shim_records` runs those through the dispatcher at start,
exactly as if they had arrived on the socket, which turns each into a journal entry above.
A record keeps the wire's plugin selector: a DEL the shim journaled as `netagent-ipam` runs
the IPAM-only handlers (`plugins.py`) and releases its reservation then and there.

The worker is a `SyncRunner` (`cni-deferred-delete`): each submitted DEL requests a run, a run
completes every queued DEL in arrival order, and a DEL that fails all its attempts fails the
run, so /healthz shows it (the record stays in the journal for the next start; it is not
retried meanwhile, since an ADD of the same attachment may follow it).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from typing import Callable

from cni import wire
from cni.config import NetConf, parse_netconf
from cni.dispatch import Handlers
from cni.ipam.plugin import LockedIpam
from cni.request import CniRequest
from netagent.cniserver.plugins import execute_for
from netagent.errors import NetagentError
from netagent.infra.clock import Clock
from netagent.infra.sync_runner import SyncKind, SyncRunner

log = logging.getLogger("netagent.cniserver.deferred_delete")

RETRY_DELAYS = (0.1, 0.5, 2.0)
JOURNAL_DIR = "pending-del"   # next to the agent's socket; cni/shim/journal.c derives the same
RESYNC_INTERVAL = 60.0   # an idle runner's empty run: how /healthz sees that its thread is alive
SHIM_RECORD_SUFFIX = ".wire"  # a DEL the shim journaled while no agent listened
SHIM_TMP_PREFIX = ".shim-"  # ... while the shim writes it; renamed when complete
STALE_SHIM_TMP = 60.0  # seconds after which a temporary file's shim is surely gone
_MAX_SHIM_RECORD = wire.MAX_HEADER + 1 + wire.MAX_ENV + wire.MAX_STDIN


def journal_dir_for(socket_path: str) -> str:
    """The journal of the agent serving `socket_path`: `pending-del/` beside the socket (the
    shim normalises no `..`, so the agent's socket path is given absolute, as the agent does)."""
    return os.path.join(os.path.dirname(os.path.abspath(socket_path)), JOURNAL_DIR)


class DeferredDeleteFailed(NetagentError):
    """A run left DELs unfinished (their records stay in the journal for the next start)."""


class DeferredDeleter:
    """A journal plus one `SyncRunner` that completes DELs in arrival order."""

    def __init__(self, journal_dir: str, *, delete_now: Callable[[NetConf, CniRequest], None],
                 clock: Clock | None = None) -> None:
        self.journal_dir = journal_dir
        self.delete_now = delete_now
        self._queue: queue.Queue[str] = queue.Queue()
        self._pending: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.runner = SyncRunner(name="cni-deferred-delete", sync=self._sync, min_interval=0.0,
                                 max_interval=RESYNC_INTERVAL, retry_interval=1.0, clock=clock)
        os.makedirs(journal_dir, mode=0o700, exist_ok=True)

    def start(self) -> int:
        """Start the worker and queue what a previous agent left in the journal."""
        replayed = 0
        for name in sorted(os.listdir(self.journal_dir)):
            if name.endswith(".json"):
                self._enqueue(name[:-5])
                replayed += 1
        if replayed:
            log.info("replaying %d DEL(s) left pending by a previous agent", replayed)
        self.runner.start()
        self.runner.request(SyncKind.FULL)   # the first run, even with nothing queued: /healthz
        return replayed

    def stop(self, *, timeout: float = 30.0) -> None:
        """Finish the queue (DELs already acknowledged) and stop the runner.

        The run in progress finishes first; what is still queued then is finished here, unless
        that run is still going after `timeout` (then it keeps the rest, and this returns)."""
        if self.runner.stop(timeout):
            self._drain()
        else:
            log.error("deferred DELs still running after %.0f s; the journal keeps the rest", timeout)

    def adopt_shim_records(self, handlers: Handlers, *, ipam_handlers: LockedIpam | None = None) -> int:
        """Carry out the DELs the shim journaled while no agent listened; return how many.

        Each record goes through the dispatcher like a request on the socket: a valid DEL
        becomes a journal entry of ours (and is queued) before its record is removed; one the
        dispatcher refuses would have been refused live too, and is logged and dropped. The
        agent calls this after binding its socket and before serving it, so a shim either
        renamed its record before we look here or reaches the socket on its second try.
        """
        adopted = 0
        for name in sorted(os.listdir(self.journal_dir)):
            path = os.path.join(self.journal_dir, name)
            if name.startswith(SHIM_TMP_PREFIX):
                with contextlib.suppress(OSError):
                    if time.time() - os.stat(path).st_mtime > STALE_SHIM_TMP:
                        os.unlink(path)  # a shim killed while writing: it never acknowledged
                continue
            if not name.endswith(SHIM_RECORD_SUFFIX):
                continue
            try:
                with open(path, "rb") as f:
                    env, stdin, plugin = wire.decode_request_for(f.read(_MAX_SHIM_RECORD + 1))
                if env.get("CNI_COMMAND") != "DEL":
                    raise wire.WireError(f"CNI_COMMAND is {env.get('CNI_COMMAND')!r}, not DEL")
            except (OSError, ValueError, wire.WireError) as exc:
                log.error("dropping the unreadable DEL record %s: %s", name, exc)
            else:
                code, out = execute_for(plugin, env, stdin, handlers=handlers, ipam_handlers=ipam_handlers)
                if code == 0:
                    adopted += 1
                else:
                    log.error("the DEL journaled by the shim as %s was refused: %s", name, out)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if adopted:
            log.info("adopted %d DEL(s) the CNI shim journaled while no agent listened", adopted)
        return adopted

    # ------------------------------------------------------------ callers
    def submit(self, key: str, conf: NetConf, req: CniRequest) -> None:
        """Journal one DEL and queue it; a DEL already pending for `key` is not queued twice."""
        with self._lock:
            if key in self._pending:
                return
        record = {"config": conf.raw, "container_id": req.container_id, "ifname": req.ifname,
                  "netns": req.netns, "args": req.args, "path": list(req.path)}
        path = os.path.join(self.journal_dir, key + ".json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
        self._enqueue(key)

    def wait_for(self, key: str, timeout: float = 30.0) -> bool:
        with self._lock:
            event = self._pending.get(key)
        return True if event is None else event.wait(timeout)

    def wait_idle(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                events = list(self._pending.values())
            if not events:
                return True
            if not events[0].wait(max(0.0, deadline - time.monotonic())):
                return False

    # ------------------------------------------------------------ worker
    def _enqueue(self, key: str) -> None:
        with self._lock:
            if key in self._pending:
                return
            self._pending[key] = threading.Event()
        self._queue.put(key)
        self.runner.request()

    def _sync(self, kind: SyncKind) -> None:
        """One run: every DEL queued (FULL and PARTIAL alike: the journal is replayed only at start)."""
        failed = self._drain()
        if failed:
            raise DeferredDeleteFailed(f"{len(failed)} DEL(s) failed; kept in the journal for the next "
                                       f"start: {', '.join(failed[:5])}")

    def _drain(self) -> list[str]:
        """Complete what is queued, in order; the keys that failed."""
        failed: list[str] = []
        while True:
            try:
                key = self._queue.get_nowait()
            except queue.Empty:
                return failed
            if not self._finish(key):
                failed.append(key)

    def _finish(self, key: str) -> bool:
        path = os.path.join(self.journal_dir, key + ".json")
        try:
            if self._complete(path):
                os.unlink(path)
                return True
            return False
        except Exception:
            log.exception("deferred DEL %s failed; it stays in the journal for the next start", key)
            return False
        finally:
            with self._lock:
                event = self._pending.pop(key, None)
            if event is not None:
                event.set()

    def _complete(self, path: str) -> bool:
        with open(path) as f:
            record = json.load(f)
        config_bytes = json.dumps(record["config"]).encode()
        conf = parse_netconf(config_bytes)
        req = CniRequest(command="DEL", container_id=record["container_id"], ifname=record["ifname"],
                         netns=record.get("netns", ""), args=record.get("args", {}),
                         path=tuple(record.get("path", ())), config_bytes=config_bytes)
        for attempt, delay in enumerate((0.0, *RETRY_DELAYS)):
            time.sleep(delay)
            try:
                self.delete_now(conf, req)
                return True
            except Exception as exc:
                log.warning("deferred DEL of %s/%s, attempt %d: %s", req.container_id, req.ifname,
                            attempt + 1, exc)
        return False
