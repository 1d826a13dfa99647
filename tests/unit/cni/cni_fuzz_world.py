"""The world the CNI fuzzing suite (test_cni_fuzz.py) runs requests in, and its invariants.

A `World` is one node: the fake kernel (`cni.fake_kernel`) with four pod namespaces, an IPAM
data directory in a temporary directory, and the plugin's handlers; on the agent paths also
the real `CniServer` on a unix socket with the real DEL journal (`DeferredDeleter`), reached
through the Python client (`client.CLIENT`) or the static shim binary (`client.SHIM`).

`check_answer` and `check_world` are the invariants every request must keep, whatever it was:
a spec answer; nothing new after a failed ADD; nothing of an attachment after its DEL; every
address a pod holds reserved by that pod's attachment; no address held by two attachments.
"""
from __future__ import annotations

import enum
import ipaddress
import json
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from cni import attachment_lock, client
from cni.ipam import config as ipam_config
from cni.dispatch import execute
from cni.fake_kernel import FakeCniKernel, setting_owner
from cni.handlers import PluginHandlers
from cni.ipam.store import is_bookkeeping
from cni.wiring import ALIAS_PREFIX, host_veth_name
from netagent.cniserver.deferred_delete import DeferredDeleter, journal_dir_for
from netagent.cniserver.server import CniServer

PODS = tuple(f"/var/run/netns/p{i}" for i in range(4))
# codes a request may be answered with here; 100 (internal error) is a crash, 11 cannot clear
# in a sequential run against a live agent
SPEC_CODES = frozenset({1, 2, 3, 4, 5, 6, 7, 50, 51, 101, 102, 103, 104, 105})


class Path(enum.Enum):
    IN_PROCESS = "in-process"
    CLIENT = "agent via client"
    SHIM = "agent via shim"


@dataclass
class Figures:
    """What one path's run did, for the closing note."""
    cases: int = 0
    requests: int = 0
    codes: Counter = field(default_factory=Counter)
    crashes: int = 0
    leaks: int = 0
    wrong_codes: int = 0
    duplicates: int = 0

    def line(self, path: Path) -> str:
        ok = self.codes.get(0, 0)
        errors = ", ".join(f"{code}: {n}" for code, n in sorted(self.codes.items()) if code)
        return (f"{path.value}: {self.cases} cases, {self.requests} requests ({ok} succeeded; error codes "
                f"{errors}); crashes {self.crashes}, leaks {self.leaks}, wrong codes {self.wrong_codes}, "
                f"duplicate addresses {self.duplicates}")


def redirect_default_data_dir(path: str) -> Callable[[], None]:
    """Make a config without a usable `dataDir` land in `path` instead of the host's own
    /var/lib/cni/networks (the IPAM store and the attachment locks); returns the undo.
    A test then asks whether `path` exists, which no other run on the machine can change."""
    saved = ipam_config.DEFAULT_DATA_DIR, attachment_lock.DEFAULT_DATA_DIR
    ipam_config.DEFAULT_DATA_DIR = attachment_lock.DEFAULT_DATA_DIR = path

    def undo() -> None:
        ipam_config.DEFAULT_DATA_DIR, attachment_lock.DEFAULT_DATA_DIR = saved
    return undo


class World:
    def __init__(self, path: Path, *, shim: str | None = None) -> None:
        self.path = path
        self.shim = shim
        self.dir = tempfile.mkdtemp(prefix="na-fz-", dir="/tmp")
        self.host_data_dir = os.path.join(self.dir, "host-default-data-dir")  # stands in for /var/lib/cni/networks
        self.data_dirs = (os.path.join(self.dir, "ipam"), os.path.join(self.dir, "ipam2"))
        self.cni_path = os.path.join(self.dir, "bin")  # empty: no delegated IPAM plugin is ever found
        os.makedirs(self.cni_path)
        self.socket_path = os.path.join(self.dir, "run", "cni.sock")
        self.kernel = FakeCniKernel()
        for pod in PODS:
            self.kernel.add_netns(pod)
        self.handlers = PluginHandlers(kernel=self.kernel, lock_timeout=10.0)
        self.deferred: DeferredDeleter | None = None
        self.server: CniServer | None = None
        if path is not Path.IN_PROCESS:
            self.deferred = DeferredDeleter(journal_dir_for(self.socket_path), delete_now=self.handlers.delete_now)
            self.handlers.deferred = self.deferred
            self.deferred.start()
            self.server = CniServer(self.socket_path, handlers=self.handlers, workers=2)
            self.server.start()
        self._undo_redirect = redirect_default_data_dir(self.host_data_dir)  # last: close() undoes it

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self.deferred is not None:
            self.deferred.stop()
        self._undo_redirect()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------ requests
    def request(self, env: dict, stdin: bytes) -> tuple[int, bytes]:
        """One request on this world's path; (exit status, stdout)."""
        if self.path is Path.SHIM:
            assert self.shim is not None
            raw = {k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in env.items()}
            proc = subprocess.run([self.shim], input=stdin, env=raw, capture_output=True, timeout=60)
            assert proc.returncode >= 0, f"the shim died of signal {-proc.returncode}"
            answer = (proc.returncode, proc.stdout)
        else:
            text_env = {k: v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v
                        for k, v in env.items()}
            if self.path is Path.IN_PROCESS:
                code, out = execute(text_env, stdin, self.handlers)
                answer = (code, out.encode())
            else:
                answer = client._relay(self.socket_path, text_env, stdin)
        if self.deferred is not None:
            assert self.deferred.wait_idle(timeout=60), "a deferred DEL did not finish"
        assert not os.path.exists(self.host_data_dir), "a fuzz request reached the host's own IPAM directory"
        return answer

    # ------------------------------------------------------------ what exists
    def reservations(self) -> dict:
        """(data dir, network, address) -> owner text, for every reservation file."""
        found = {}
        for data_dir in self.data_dirs:
            if not os.path.isdir(data_dir):
                continue
            for network in os.listdir(data_dir):
                directory = os.path.join(data_dir, network)
                if network.startswith(".") or not os.path.isdir(directory):
                    continue
                for name in os.listdir(directory):
                    if not is_bookkeeping(name):
                        with open(os.path.join(directory, name), errors="replace", newline="") as f:
                            found[(data_dir, network, name)] = f.read()
        return found

    def snapshot(self) -> dict:
        """Everything an attachment can leave; the shared bridge and global sysctls excepted."""
        state: dict = {"reservations": self.reservations(), "handles": sorted(self.kernel.open_handles)}
        for path, space in self.kernel.namespaces.items():
            links = {name: (link.kind, link.alias, link.master, link.peer, sorted(map(str, link.addresses)))
                     for name, link in space.links.items() if link.kind != "bridge"}
            state[path or "node"] = (links, sorted((str(r.dst), str(r.gateway), d) for r, d in space.routes.items()),
                                     sorted(space.neighbours.items()))
            bridges = {name for name, link in space.links.items() if link.kind == "bridge"}
            state[f"{path or 'node'} sysctls"] = sorted(
                (key, value) for key, value in space.settings.items() if setting_owner(key) not in bridges | {""})
        return state


# ---------------------------------------------------------------- invariants

def check_answer(figures: Figures, command: object, answer: tuple[int, bytes]) -> dict | None:
    """The answer is the spec's: exit 0 with a result (or nothing), or exit 1 with an error
    object whose code is a spec code and whose message says something. Returns the JSON."""
    status, out = answer
    try:
        parsed = json.loads(out) if out.strip() else None
    except ValueError:
        figures.crashes += 1
        raise AssertionError(f"stdout is not JSON: {out[:300]!r}") from None
    if status == 0:
        figures.codes[0] += 1
        if command in ("ADD", "VERSION"):
            assert isinstance(parsed, dict) and "cniVersion" in parsed, parsed
        else:
            assert parsed is None, parsed
        return parsed
    if not (status == 1 and isinstance(parsed, dict) and isinstance(parsed.get("code"), int)
            and isinstance(parsed.get("msg"), str) and parsed["msg"]):
        figures.crashes += 1
        raise AssertionError(f"exit {status} without a spec error object: {out[:300]!r}")
    figures.codes[parsed["code"]] += 1
    if parsed["code"] == 100:
        figures.crashes += 1
        raise AssertionError(f"internal error (a crash caught by the dispatcher): {parsed}")
    if parsed["code"] not in SPEC_CODES:
        figures.wrong_codes += 1
        raise AssertionError(f"code {parsed['code']} for {command}: {parsed}")
    return parsed


def _pod_addresses(world: World) -> list[tuple[str, str, str]]:
    """(host veth, network, address) for every address on a pod end of one of our veths."""
    held = []
    for name, link in world.kernel.node.links.items():
        if link.kind != "veth" or not (link.alias or "").startswith(ALIAS_PREFIX) or link.peer is None:
            continue
        network = link.alias[len(ALIAS_PREFIX):]
        space = world.kernel.namespaces.get(link.peer[0])
        pod = space.links.get(link.peer[1]) if space is not None else None
        for address in (pod.addresses if pod is not None else ()):
            held.append((name, network, str(address.ip)))
    return held


def check_world(world: World, figures: Figures) -> None:
    """No address on two pods of one network; each pod address reserved by its own attachment."""
    reservations = world.reservations()
    seen: dict = {}
    for veth, network, address in _pod_addresses(world):
        if (network, address) in seen:
            figures.duplicates += 1
            raise AssertionError(f"{address} is on the pods of both {seen[network, address]} and {veth}")
        seen[network, address] = veth
        owners = [owner for (_, net, name), owner in reservations.items()
                  if net == network and name == address]
        owned = any(host_veth_name(network, *owner.split("\r\n", 1)) == veth
                    for owner in owners if "\r\n" in owner)
        if not owned:
            figures.duplicates += 1
            raise AssertionError(f"{address} is on the pod of {veth} but reserved by {owners or 'nobody'}: "
                                 "the next ADD could hand it out again")


def check_failed_add(world: World, figures: Figures, before: dict) -> None:
    after = world.snapshot()
    if after != before:
        figures.leaks += 1
        changed = {k: (before.get(k), after.get(k)) for k in set(before) | set(after) if before.get(k) != after.get(k)}
        raise AssertionError(f"a failed ADD changed the node: {changed}")


def check_deleted(world: World, figures: Figures, *, network: str, container_id: str, ifname: str) -> None:
    veth = host_veth_name(network, container_id, ifname)
    owner = container_id.strip() + "\r\n" + ifname
    left = [key for key, content in world.reservations().items() if key[1] == network and content.strip() == owner]
    if veth in world.kernel.node.links or left:
        figures.leaks += 1
        raise AssertionError(f"after DEL of {container_id}/{ifname}: veth {veth in world.kernel.node.links}, "
                             f"reservations {left}")

