"""The `netagent-ipam` plugin (ipam.type "netagent-ipam"): its handlers and its Python entry point.

Lets other main plugins (bridge, ptp, macvlan, ...) use netagent's host-local compatible
IPAM the way they would use host-local. The installed binary is the static shim
(cni/shim/), which relays the request to the agent with the `netagent-ipam` selector of
cni/wire.py; the agent runs `run_ipam` on it. `main` runs the same `run_ipam` in-process
(the Python script `PluginBinary.PYTHON` installs for the lab and tests), as `python -I -S`,
so this module and everything it imports stay stdlib only.

`LockedIpam` is `BuiltinIpam` holding the attachment's lock (cni/attachment_lock.py, keyed
by network, container ID and ifname like the main plugin's) around ADD, DEL and CHECK, so
the one-operation-per-attachment rule holds for IPAM-only requests too, whichever process
serves them; the IPAM config is validated before the lock is taken, so a refused request
leaves no lock file. The main plugin's own builtin IPAM runs unwrapped: it is already under that lock.
"""
from __future__ import annotations

import os
import sys
from contextlib import AbstractContextManager

from cni import attachment_lock
from cni.attachment_lock import AttachmentLock
from cni.config import ConfigScope, NetConf
from cni.dispatch import execute
from cni.ipam.builtin import BuiltinIpam, parse_for
from cni.request import CniRequest
from cni.wiring import host_veth_name


class LockedIpam:
    """The IPAM-only plugin's handlers (`cni.dispatch.Handlers`): `BuiltinIpam` under the attachment lock."""

    def __init__(self, ipam: BuiltinIpam | None = None, *,
                 lock_timeout: float = attachment_lock.LOCK_TIMEOUT) -> None:
        self.ipam = ipam or BuiltinIpam()
        self.lock_timeout = lock_timeout

    def _locked(self, conf: NetConf, req: CniRequest) -> AbstractContextManager[AttachmentLock]:
        parse_for(conf)  # a bad IPAM config (a relative dataDir) is refused before any lock file exists
        host_name = host_veth_name(conf.name, req.container_id, req.ifname)
        return attachment_lock.held(attachment_lock.lock_path(conf, host_name), timeout=self.lock_timeout)

    def add(self, conf: NetConf, req: CniRequest) -> dict:
        with self._locked(conf, req):
            return self.ipam.add(conf, req)

    def delete(self, conf: NetConf, req: CniRequest) -> None:
        with self._locked(conf, req) as lock:
            self.ipam.delete(conf, req)
            lock.remove()  # the attachment is gone, as the main plugin's DEL leaves it

    def check(self, conf: NetConf, req: CniRequest) -> None:
        with self._locked(conf, req):
            self.ipam.check(conf, req)

    def gc(self, conf: NetConf, req: CniRequest, valid: set) -> None:
        self.ipam.gc(conf, req, valid)

    def status(self, conf: NetConf, req: CniRequest) -> None:
        self.ipam.status(conf, req)


def run_ipam(environ, stdin: bytes, handlers: LockedIpam | None = None) -> tuple[int, str]:
    """One IPAM-only request through the dispatcher: (exit code, stdout). Never raises."""
    return execute(environ, stdin, handlers or LockedIpam(), scope=ConfigScope.IPAM)


def main() -> int:
    stdin = sys.stdin.buffer.read()
    code, out = run_ipam(os.environ, stdin)
    if out:
        sys.stdout.write(out)
        sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
