"""`DelegatedIpam`: run the external IPAM plugin named by `ipam.type` (host-local, dhcp,
whereabouts, ...) the way a main plugin does, and hand back its answer in our shape.

The plugin is looked up in the request's `CNI_PATH` and run with the same command,
container, netns, ifname, `CNI_ARGS` and the unchanged stdin config, exactly as the
reference plugins' `ipam.ExecAdd` does. GC and STATUS only exist from spec 1.1.0 on, so
for older configs GC does nothing and STATUS only checks that the plugin is there.
A missing plugin is code 7 (from `find_plugin`); a plugin's own error object comes back
as the `CniError` `run_plugin` raises, code and message intact.

`cni.invoke` needs `subprocess`, which the builtin path never loads: it is imported
inside the methods, and `cni.ipam.ipam_for` imports this module only when delegating.
"""
from __future__ import annotations

from cni import result as cni_result
from cni import version as cni_version
from cni.config import NetConf
from cni.errors import CniError, ErrorCode
from cni.ipam.allocation import Allocation
from cni.request import CniRequest


def cni_args_text(args: dict) -> str:
    """The request's parsed CNI_ARGS, back in `K=V;K2=V2` form."""
    return ";".join(f"{key}={value}" for key, value in args.items())


def _run(conf: NetConf, req: CniRequest, *, command: str) -> dict | None:
    from cni import invoke

    binary = invoke.find_plugin(conf.ipam_type, req.path)
    env = invoke.cni_environment(command=command, container_id=req.container_id,
                                 netns=req.netns, ifname=req.ifname,
                                 args=cni_args_text(req.args), path=req.path)
    return invoke.run_plugin(binary, env, req.config_bytes)


def ipam_result(output: dict | None, *, plugin: str) -> dict:
    """A delegate's ADD output -> ips (without `interface`), routes and dns."""
    if not isinstance(output, dict):
        raise CniError(ErrorCode.DELEGATE_FAILED, f"IPAM plugin {plugin!r} printed no result")
    normalized = cni_result.normalize(output)
    for ip in normalized["ips"]:
        ip.pop("interface", None)
    return {"ips": normalized["ips"], "routes": normalized["routes"], "dns": normalized["dns"]}


class DelegatedIpam:
    """Handlers that forward each operation to the IPAM plugin binary."""

    def add(self, conf: NetConf, req: CniRequest) -> dict:
        return ipam_result(_run(conf, req, command="ADD"), plugin=conf.ipam_type)

    def allocate(self, conf: NetConf, req: CniRequest) -> Allocation:
        """ADD, its result's strings parsed once for the main plugin's handlers."""
        return Allocation.from_result(self.add(conf, req))

    def delete(self, conf: NetConf, req: CniRequest) -> None:
        _run(conf, req, command="DEL")

    def check(self, conf: NetConf, req: CniRequest) -> None:
        _run(conf, req, command="CHECK")

    def gc(self, conf: NetConf, req: CniRequest, valid: set) -> None:
        if cni_version.at_least(conf.cni_version, "1.1.0"):
            _run(conf, req, command="GC")

    def status(self, conf: NetConf, req: CniRequest) -> None:
        if cni_version.at_least(conf.cni_version, "1.1.0"):
            _run(conf, req, command="STATUS")
        else:
            from cni import invoke

            invoke.find_plugin(conf.ipam_type, req.path)
