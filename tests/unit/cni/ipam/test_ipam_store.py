"""DiskStore's on-disk layout and locking, FakeStore's fidelity to it, and allocation
under concurrency: threads and separate processes sharing one data directory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cni.config import parse_netconf
from cni.errors import CniError, ErrorCode
from cni.ipam.builtin import BuiltinIpam
from cni.ipam.fake_store import FakeStore
from cni.ipam.store import DiskStore, owner_text
from cni.request import CniRequest
from tests.unit.cni.ipam.ipam_worker import WORKER_SCRIPT

REPO = Path(__file__).resolve().parents[4]


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def netconf(data_dir: Path, subnet: str = "10.0.0.0/24"):
    raw = {"cniVersion": "1.0.0", "name": "podnet", "type": "netagent",
           "ipam": {"type": "netagent", "dataDir": str(data_dir), "subnet": subnet}}
    return parse_netconf(json.dumps(raw).encode())


def request(container_id: str, ifname: str = "eth0") -> CniRequest:
    return CniRequest(command="ADD", container_id=container_id, netns="/x", ifname=ifname)


@pytest.fixture(params=["disk", "fake"])
def any_store(request, tmp_path):
    return DiskStore(str(tmp_path / "net")) if request.param == "disk" else FakeStore()


def test_layout_matches_host_local(tmp_path):
    BuiltinIpam().add(netconf(tmp_path), request("c1"))
    directory = tmp_path / "podnet"
    umask = current_umask()
    assert sorted(os.listdir(directory)) == ["10.0.0.2", "last_reserved_ip.0", "lock"]
    assert (directory / "10.0.0.2").read_bytes() == b"c1\r\neth0"
    assert (directory / "last_reserved_ip.0").read_bytes() == b"10.0.0.2"
    assert directory.stat().st_mode & 0o777 == 0o755 & ~umask
    assert (directory / "10.0.0.2").stat().st_mode & 0o777 == 0o644 & ~umask


def test_owner_text_trims_the_container_id():
    assert owner_text(" c1 \n", "eth0") == "c1\r\neth0"


def test_store_contract(any_store):
    store = any_store
    assert not store.exists() and store.names() == []
    with store.locked():
        assert store.reserve("10.0.0.5", owner="c1\r\neth0")
        assert not store.reserve("10.0.0.5", owner="c2\r\neth0")
        store.set_last_reserved(0, "10.0.0.5")
    assert store.exists()
    assert store.names() == ["10.0.0.5"]
    assert store.read_owner("10.0.0.5") == "c1\r\neth0"
    assert store.read_owner("10.0.0.6") is None
    assert store.last_reserved(0) == "10.0.0.5" and store.last_reserved(1) is None
    assert store.release("10.0.0.5") and not store.release("10.0.0.5")
    store.ensure_writable()


def test_disk_names_skip_bookkeeping_and_directories(tmp_path):
    store = DiskStore(str(tmp_path))
    for name in ("10.0.0.2", "lock", "last_reserved_ip.0", "last_reserved_ip.1"):
        (tmp_path / name).write_text("x")
    (tmp_path / "10.0.0.3").mkdir()
    assert store.names() == ["10.0.0.2"]


def test_disk_reads_are_trimmed_and_tolerant(tmp_path):
    store = DiskStore(str(tmp_path))
    (tmp_path / "10.0.0.2").write_bytes(b"  c1\r\neth0\n")
    (tmp_path / "last_reserved_ip.0").write_bytes(b"10.0.0.2\n")
    assert store.read_owner("10.0.0.2") == "c1\r\neth0"
    assert store.last_reserved(0) == "10.0.0.2"
    assert DiskStore(str(tmp_path / "missing")).names() == []


def test_disk_reserve_never_overwrites(tmp_path):
    store = DiskStore(str(tmp_path))
    (tmp_path / "10.0.0.2").write_bytes(b"other\r\neth0")
    assert not store.reserve("10.0.0.2", owner="c1\r\neth0")
    assert (tmp_path / "10.0.0.2").read_bytes() == b"other\r\neth0"


def test_disk_errors_are_code_5(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = DiskStore(str(blocker / "net"))
    for call in (store.ensure_writable, lambda: store.locked().__enter__()):
        with pytest.raises(CniError) as caught:
            call()
        assert caught.value.code == ErrorCode.IO_FAILURE


def test_lock_is_a_flock_on_the_lock_file_seen_by_other_processes(tmp_path):
    store = DiskStore(str(tmp_path / "net"))
    probe = ("import fcntl, os, sys\n"
             "fd = os.open(sys.argv[1], os.O_RDWR)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('free')\n"
             "except BlockingIOError:\n    print('busy')\n")
    with store.locked():
        held = subprocess.run([sys.executable, "-c", probe, store.lock_path],
                              capture_output=True, text=True, check=True).stdout.strip()
    after = subprocess.run([sys.executable, "-c", probe, store.lock_path],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert (held, after) == ("busy", "free")


def test_lock_excludes_other_threads_of_the_same_process(tmp_path):
    store = DiskStore(str(tmp_path / "net"))
    entered = threading.Event()

    def contender():
        with store.locked():
            entered.set()

    with store.locked():
        thread = threading.Thread(target=contender)
        thread.start()
        assert not entered.wait(0.3)
    assert entered.wait(30)
    thread.join()


def test_fake_store_lock_excludes_threads():
    store = FakeStore()
    entered = threading.Event()
    with store.locked():
        thread = threading.Thread(target=lambda: (store.locked().__enter__(), entered.set()))
        thread.start()
        assert not entered.wait(0.2)
    assert entered.wait(30)
    thread.join()


def test_threads_allocate_distinct_addresses(tmp_path):
    conf, ipam = netconf(tmp_path), BuiltinIpam()
    results: dict = {}
    errors: list = []

    def worker(thread_index: int) -> None:
        try:
            for i in range(25):
                cid = f"t{thread_index}-{i}"
                results[cid] = ipam.add(conf, request(cid))["ips"][0]["address"]
        except Exception as exc:  # reported below, with the thread's context
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(results) == 200 and len(set(results.values())) == 200
    files = [n for n in os.listdir(tmp_path / "podnet") if n.startswith("10.")]
    assert len(files) == 200
    owners = {(tmp_path / "podnet" / n).read_bytes().decode().split("\r\n")[0] for n in files}
    assert owners == set(results)




def test_processes_allocate_distinct_addresses(tmp_path):
    raw = json.dumps({"cniVersion": "1.0.0", "name": "podnet", "type": "netagent",
                      "ipam": {"type": "netagent", "dataDir": str(tmp_path),
                               "subnet": "10.0.0.0/24"}})
    procs = [subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, str(REPO), raw, f"p{n}", "25"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in range(4)]
    got = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        got.extend(json.loads(out))
    assert len(got) == 100 and len(set(got)) == 100
    assert len([n for n in os.listdir(tmp_path / "podnet") if n.startswith("10.")]) == 100


def test_lock_is_held_for_the_whole_operation(tmp_path, monkeypatch):
    """A reservation made while another holder has the lock waits for it."""
    conf, ipam = netconf(tmp_path), BuiltinIpam()
    ipam.add(conf, request("first"))
    store = DiskStore(str(tmp_path / "podnet"))
    done = threading.Event()
    with store.locked():
        thread = threading.Thread(target=lambda: (ipam.add(conf, request("second")), done.set()))
        thread.start()
        time.sleep(0.2)
        assert not done.is_set()
        assert sorted(n for n in os.listdir(tmp_path / "podnet") if n.startswith("10.")) == \
            ["10.0.0.2"]
    assert done.wait(30)
    thread.join()
