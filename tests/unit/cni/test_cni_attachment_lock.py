"""Per-attachment serialization (issue 10, defect 10): the lock itself, and DEL racing ADD.

The lock (`cni.attachment_lock`) is a flock on a file, so it is proved here across threads
and across processes; the race runs ADD and DEL of one container at the same moment,
many times, on the handlers over the fake kernel and the real IPAM store, with and without
the agent's deferred DEL, and checks after each trial that the veth exists exactly when
the reservation does. tests/netns/test_cni_hostile.py runs the same race on the real
kernel through both paths.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from cni import attachment_lock
from cni.errors import CniError, ErrorCode
from cni.fake_kernel import FakeCniKernel
from cni.handlers import PluginHandlers
from cni.wiring import host_veth_name
from netagent.cniserver.deferred_delete import DeferredDeleter
from tests.unit.cni.test_cni_handlers import NETNS, NETWORK, make_conf, make_req, reservations


def test_a_second_holder_waits_and_times_out_with_code_11(tmp_path):
    path = str(tmp_path / "locks" / "na0123.lock")
    with attachment_lock.held(path):
        with pytest.raises(CniError) as failed:
            with attachment_lock.held(path, timeout=0.2):
                pass
        assert failed.value.code == ErrorCode.TRY_AGAIN_LATER
    with attachment_lock.held(path, timeout=0.2):
        pass  # free again


def test_the_lock_excludes_another_process(tmp_path):
    path = str(tmp_path / "na0123.lock")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys; from cni import attachment_lock\n"
        f"with attachment_lock.held({path!r}):\n"
        "    print('held', flush=True); sys.stdin.readline()\n")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        # the other process holds it until told: we are refused for as long as we wait
        with pytest.raises(CniError) as refused:
            with attachment_lock.held(path, timeout=0.3):
                pass
        assert refused.value.code == ErrorCode.TRY_AGAIN_LATER
        holder.stdin.write("release\n")
        holder.stdin.close()
        with attachment_lock.held(path, timeout=30):
            pass  # and we get it once that process let go
    finally:
        holder.kill()  # a no-op when it already ended
        holder.wait(timeout=30)
        holder.stdout.close()


def test_a_waiter_follows_the_file_a_del_removed(tmp_path, monkeypatch):
    path = str(tmp_path / "na0123.lock")
    order = []
    refused = threading.Event()
    waiter_thread: list[threading.Thread] = []

    class WatchedTime:  # attachment_lock's clock; sleep() is called only after a refused try
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            if threading.current_thread() in waiter_thread:
                refused.set()
            time.sleep(seconds)

    monkeypatch.setattr(attachment_lock, "time", WatchedTime)

    def second() -> None:
        with attachment_lock.held(path, timeout=30):
            order.append("second")

    with attachment_lock.held(path) as lock:
        waiter = threading.Thread(target=second)
        waiter_thread.append(waiter)
        waiter.start()
        assert refused.wait(30), "the waiter never tried the held file"
        order.append("first")
        lock.remove()
    waiter.join(timeout=30)
    assert order == ["first", "second"]
    # the waiter took (created) the file the path names now, not the removed one
    assert os.path.exists(path)


def test_gc_removes_only_lock_files_nobody_holds(tmp_path):
    fake = FakeCniKernel()
    fake.add_netns(NETNS)
    handlers = PluginHandlers(kernel=fake)
    conf = make_conf(tmp_path)
    handlers.add(conf, make_req())
    stale = attachment_lock.lock_path(conf, host_veth_name(NETWORK, "killed", "eth0"))
    held = attachment_lock.lock_path(conf, host_veth_name(NETWORK, "running", "eth0"))
    with attachment_lock.held(stale):
        pass  # a file left by an ADD killed after creating it
    with attachment_lock.held(held):
        handlers.gc(conf, make_req("GC"), {("c1", "eth0")})
        assert os.path.exists(held)
    assert not os.path.exists(stale)
    assert os.path.exists(attachment_lock.lock_path(conf, host_veth_name(NETWORK, "c1", "eth0")))


def _race_once(handlers: PluginHandlers, conf, barrier: threading.Barrier) -> dict:
    outcome: dict = {}

    def run(command: str) -> None:
        barrier.wait()
        try:
            if command == "ADD":
                handlers.add(conf, make_req())
            else:
                handlers.delete(conf, make_req("DEL"))
            outcome[command] = 0
        except CniError as err:
            outcome[command] = err.code

    threads = [threading.Thread(target=run, args=(c,)) for c in ("ADD", "DEL")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcome


@pytest.mark.parametrize("path", ["in-process", "agent"])
def test_del_racing_add_never_leaves_an_address_without_its_veth(tmp_path, path):
    fake = FakeCniKernel()
    fake.add_netns(NETNS)
    handlers = PluginHandlers(kernel=fake)
    deferred = None
    if path == "agent":
        deferred = DeferredDeleter(str(tmp_path / "journal"), delete_now=handlers.delete_now)
        handlers.deferred = deferred
        deferred.start()
    conf = make_conf(tmp_path / "ipam")
    host = host_veth_name(NETWORK, "c1", "eth0")
    try:
        for trial in range(30):
            outcome = _race_once(handlers, conf, threading.Barrier(2))
            if deferred is not None:
                assert deferred.wait_idle(timeout=30)
            assert outcome == {"ADD": 0, "DEL": 0}, (trial, outcome)
            veth = host in fake.node.links
            reserved = reservations(tmp_path / "ipam") != []
            assert veth == reserved, f"trial {trial}: veth {veth}, reservation {reserved}"
            handlers.delete(conf, make_req("DEL"))  # the runtime's DEL that follows
            if deferred is not None:
                assert deferred.wait_idle(timeout=30)
            assert host not in fake.node.links and reservations(tmp_path / "ipam") == []
    finally:
        if deferred is not None:
            deferred.stop()
