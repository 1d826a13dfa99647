"""With NetworkPolicy on, a pod has its policy when its CNI ADD returns: the handlers' wrapper.

`PolicyBoundHandlers` wraps the plugin's handlers (cni/handlers.py, unchanged): after a
successful ADD, before the reply, it hands the policy engine (`PodBinder`: in-process, the
daemon's `PolicyEngine`) the addresses the ADD chose (every one: a dual-stack pod's IPv4 and
IPv6 are both bound, each programmed in its family's dataplane), the pod `CNI_ARGS` names and
the host interface, and waits at most `wait` seconds for the pod's policy to be written
(netagent/policy/pod_binding.py plans it from the reflector's cache: no API call here). A DEL
unbinds the same way once it has been accepted.

Programming never fails an ADD: whatever the engine answers or raises, the ADD's result goes
back to the runtime. A pod that could not be programmed in time stays closed, as every new pod
was before (the KNOWN set), and the engine's runner programs it when it can (the reason is
counted in `netagent_policy_pods_closed_after_add_total`). Only the main plugin's ADD and DEL
come here; the IPAM-only plugin (`netagent-ipam`) and CHECK, GC, STATUS pass through.
"""
from __future__ import annotations

import logging
import time
from typing import Protocol

from cni import wiring
from cni.config import NetConf
from cni.dispatch import Handlers
from cni.request import CniRequest

log = logging.getLogger("netagent.cniserver.policy_binding")


class BindResult(Protocol):
    @property
    def programmed(self) -> bool: ...


class PodBinder(Protocol):
    """What the CNI server asks of the policy engine (`PolicyEngine.bind_pod`, `unbind_pod`)."""
    def bind_pod(self, namespace: object, name: object, addresses: tuple[str, ...], interface: str, *,
                 container_id: str, deadline: float) -> BindResult: ...

    def unbind_pod(self, namespace: object, name: object, *, container_id: str,
                   deadline: float) -> BindResult: ...


def result_addresses(result: dict) -> tuple[str, ...]:
    """The addresses (CIDR text) in a handler's ADD result."""
    ips = result.get("ips")
    return tuple(str(entry["address"]) for entry in ips if isinstance(entry, dict) and "address" in entry) \
        if isinstance(ips, list) else ()


class PolicyBoundHandlers:
    """`cni.dispatch.Handlers` that program the pod's policy inside the ADD (see the module)."""

    def __init__(self, inner: Handlers, binder: PodBinder, *, wait: float) -> None:
        self.inner = inner
        self.binder = binder
        self.wait = wait

    def add(self, conf: NetConf, req: CniRequest) -> dict:
        result = self.inner.add(conf, req)
        interface = wiring.host_veth_name(conf.name, req.container_id, req.ifname)
        try:
            self.binder.bind_pod(req.pod_namespace, req.pod_name, result_addresses(result), interface,
                                 container_id=req.container_id, deadline=time.monotonic() + self.wait)
        except Exception:     # never the ADD's failure: the pod stays closed, the runner retries
            log.exception("network policy: binding pod %.300s/%.300s failed; it stays closed",
                          req.pod_namespace, req.pod_name)
        return result

    def delete(self, conf: NetConf, req: CniRequest) -> None:
        self.inner.delete(conf, req)
        try:
            self.binder.unbind_pod(req.pod_namespace, req.pod_name, container_id=req.container_id,
                                   deadline=time.monotonic() + self.wait)
        except Exception:
            log.exception("network policy: unbinding pod %.300s/%.300s failed", req.pod_namespace, req.pod_name)

    def check(self, conf: NetConf, req: CniRequest) -> None:
        self.inner.check(conf, req)

    def gc(self, conf: NetConf, req: CniRequest, valid: set) -> None:
        self.inner.gc(conf, req, valid)

    def status(self, conf: NetConf, req: CniRequest) -> None:
        self.inner.status(conf, req)
