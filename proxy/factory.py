"""Building a proxy backend on the real kernel, for the agent, `status services` and `cleanup`.

The one place that knows each backend's constructor and its kernel parts (iptables
runner, ipset, IPVS netlink table, dummy device, sysctls). A caller names a backend by its
spec, one frozen value per backend holding only that backend's choices (`IptablesSpec`,
`IpvsSpec`, `NftablesSpec`, `EbpfSpec`; `spec_for` a mode's defaults), so no option of one
backend travels through another's path.
Everything runs in the caller's network namespace unless `netns` names another (tests and
benchmarks program a namespace they created, from the root namespace). The eBPF backend is
placed by a cgroup and a bpffs directory instead (`EbpfPaths`), never by a default: its
programs act on every socket of that cgroup whatever its network namespace.

Each backend is built for one IP family (`family`, default IPv4), as kube-proxy builds one
proxier per family: iptables through that family's binaries, and `family=` handed to the
nftables, IPVS and eBPF backends' constructors; a
second family's eBPF backend shares the maps the first one loaded (`first`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from netagent.kernel.ipset import IpsetRunner
from netagent.infra.rejections import RejectionScope
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.backend import IptablesBackend, IptablesNotInstalled
from netagent.kernel.iptables.runner import IptablesRunner
from netagent.kernel.namespaces import exec_prefix
from proxy.backend import ProxyBackend, ProxyMode
from proxy.ebpf.backend import EbpfPaths
from netagent.errors import NetagentError


class BackendConfigError(NetagentError):
    pass


@dataclass(frozen=True)
class IptablesSpec:
    """The iptables backend: through `iptables_backend`'s restore tools (legacy or nft)."""
    iptables_backend: IptablesBackend
    mode: ClassVar[ProxyMode] = ProxyMode.IPTABLES


@dataclass(frozen=True)
class IpvsSpec:
    """The IPVS backend: its helper rules through `iptables_backend`, `scheduler` for every
    virtual server."""
    iptables_backend: IptablesBackend
    scheduler: str = "rr"
    mode: ClassVar[ProxyMode] = ProxyMode.IPVS


@dataclass(frozen=True)
class NftablesSpec:
    """The nftables backend: libnftables, nothing to choose."""
    mode: ClassVar[ProxyMode] = ProxyMode.NFTABLES


@dataclass(frozen=True)
class EbpfSpec:
    """The eBPF backend: where its programs act (`paths`, never defaulted); `rejections`:
    where it records the Services its maps have no room for; `first`: the backend already
    built for the node's first family (the programs are loaded once for both families, so a
    second family's backend writes the maps `first` pinned); `load` False only opens what an
    agent pinned (status, cleanup: no compiler needed)."""
    paths: EbpfPaths | None
    rejections: RejectionScope | None = None
    first: ProxyBackend | None = None
    load: bool = True
    mode: ClassVar[ProxyMode] = ProxyMode.EBPF


BackendSpec = IptablesSpec | IpvsSpec | NftablesSpec | EbpfSpec


def spec_for(mode: ProxyMode, *, iptables_backend: IptablesBackend) -> BackendSpec:
    """The spec of `mode` with every choice at its default (status, cleanup, benchmarks); the
    eBPF backend has no default place, so its spec is built by the caller."""
    if mode is ProxyMode.IPTABLES:
        return IptablesSpec(iptables_backend)
    if mode is ProxyMode.IPVS:
        return IpvsSpec(iptables_backend)
    if mode is ProxyMode.NFTABLES:
        return NftablesSpec()
    raise BackendConfigError("the eBPF backend is placed by a cgroup and a bpffs: build its EbpfSpec")


def build_backend(spec: BackendSpec, *, family: IpFamily = IpFamily.V4, netns: str | None = None) -> ProxyBackend:
    """The backend `spec` names, for `family`, programming `netns` (None: this namespace;
    the eBPF backend is placed by its paths instead)."""
    if isinstance(spec, EbpfSpec):
        return _build_ebpf(spec, family)
    if isinstance(spec, NftablesSpec):
        return build_nftables_backend(netns=netns, family=family)
    if isinstance(spec, IptablesSpec):
        from proxy.iptables.backend import IptablesProxy
        return IptablesProxy(iptables=IptablesRunner(backend=spec.iptables_backend, family=family,
                                                     exec_prefix=exec_prefix(netns)),
                             ipset=IpsetRunner(exec_prefix=exec_prefix(netns)))
    from proxy.ipvs.proxy import IpvsProxy
    from proxy.ipvs.render import IpvsSettings
    from proxy.ipvs.table import Scheduler
    return IpvsProxy.in_namespace(netns=netns, iptables_backend=spec.iptables_backend,
                                  settings=IpvsSettings(scheduler=Scheduler(spec.scheduler)), family=family)


def _build_ebpf(spec: EbpfSpec, family: IpFamily) -> ProxyBackend:
    from proxy.ebpf.backend import EbpfProxy
    first = spec.first
    if isinstance(first, EbpfProxy) and family is not first.family:
        return EbpfProxy(maps=first.root_maps, paths=first.paths, tc_snat=first.tc_snat,
                         rejections=spec.rejections, family=family)
    return build_ebpf_backend(spec.paths, load=spec.load, rejections=spec.rejections, family=family)


def build_nftables_backend(*, netns: str | None = None, family: IpFamily = IpFamily.V4) -> ProxyBackend:
    """The nftables backend over libnftables, in `netns` (None: this namespace)."""
    from netagent.kernel.nftables.runner import NftError, NftRunner
    from proxy.nftables.backend import NftablesProxy
    try:
        return NftablesProxy(nft=NftRunner(netns), family=family)
    except NftError as error:
        raise BackendConfigError(f"--proxy-mode nftables: {error}") from None


def build_ebpf_backend(paths: EbpfPaths | None, *, load: bool = True, tc_snat: bool = False,
                       rejections: RejectionScope | None = None, family: IpFamily = IpFamily.V4) -> ProxyBackend:
    """Compile, load and attach the programs (`load`), then open the pinned maps; without
    `load`, only open what an agent pinned (status, cleanup: no compiler needed)."""
    from ebpf.loader import EbpfError, SocketLbLoader, check_bpf_root, pin_dir
    from ebpf.mapset import MapSet
    from proxy.ebpf.backend import EbpfProxy
    if paths is None or not paths.bpf_root or not paths.cgroup:
        raise BackendConfigError("--proxy-mode ebpf needs --bpf-root (a bpffs mount) and --cgroup-root "
                                 "(the cgroup v2 directory whose sockets are balanced)")
    report = None
    veth_fds: dict[str, int] = {}   # the pod veths' programs, kept by the loader for the attacher
    try:
        if load:
            loader = SocketLbLoader(bpf_root=paths.bpf_root, cgroup=paths.cgroup, tc_device=paths.tc_device,
                                    pod_veths=paths.pod_veths, sizes=paths.map_sizes)
            if paths.tc_device:
                from ebpf.tc import tc_sysctls
                from netagent.kernel.sysctl import ProcSysctls, ensure_sysctls
                ensure_sysctls(ProcSysctls(), tc_sysctls(paths.tc_device))
            report = loader.ensure_loaded()
            veth_fds = loader.pod_veth_fds
        else:
            check_bpf_root(paths.bpf_root)
        maps = MapSet.open_pinned(pin_dir(paths.bpf_root))
    except (EbpfError, OSError, LookupError) as error:
        for fd in veth_fds.values():
            os.close(fd)
        raise BackendConfigError(str(error)) from None
    pod_veths = None
    if veth_fds:
        from ebpf.pod_veths import PodVethAttacher
        pod_veths = PodVethAttacher(veth_fds)
        try:
            pod_veths.start()
        except Exception as error:
            pod_veths.stop()
            maps.close()
            raise BackendConfigError(f"watching for pod veths: {error}") from None
    return EbpfProxy(maps=maps, paths=paths, load_report=report, tc_snat=tc_snat, pod_veths=pod_veths,
                     rejections=rejections, family=family)


def programmed_mode(*, iptables_backend: IptablesBackend, netns: str | None = None,
                    bpf_root: str | None = None) -> ProxyMode | None:
    """Which backend has programmed this namespace: eBPF when `bpf_root` holds our pinned maps,
    nftables when our nft table exists, IPVS when its device exists, iptables when our service
    chain does, None when none."""
    if bpf_root:
        from ebpf.loader import pin_dir
        if os.path.isdir(pin_dir(bpf_root)):
            return ProxyMode.EBPF
    if _nft_table_exists(netns):
        return ProxyMode.NFTABLES
    from proxy.ipvs.netlink import NetlinkAddressDevice
    if NetlinkAddressDevice(netns=netns).exists():
        return ProxyMode.IPVS
    return ProxyMode.IPTABLES if iptables_families(iptables_backend=iptables_backend, netns=netns) else None


def iptables_families(*, iptables_backend: IptablesBackend, netns: str | None = None) -> tuple[IpFamily, ...]:
    """The families whose iptables hold the iptables proxy's service chain (ip6tables too)."""
    from proxy.iptables.names import FIXED_CHAINS
    found = []
    for family in IpFamily:
        try:
            runner = IptablesRunner(backend=iptables_backend, family=family, exec_prefix=exec_prefix(netns))
        except IptablesNotInstalled:   # no ip6tables here: nothing of ours there either
            if family is IpFamily.V4:
                raise
            continue
        if set(runner.list_chains("nat")) & set(FIXED_CHAINS["nat"]):
            found.append(family)
    return tuple(found)


def _nft_table_exists(netns: str | None) -> bool:
    """Whether the nftables proxy's table is in the namespace (False where nft cannot be used)."""
    from netagent.kernel import owned
    from netagent.kernel.nftables.runner import NftError, NftRunner
    try:
        runner = NftRunner(netns)
    except NftError:
        return False
    try:
        return any(name == owned.NFT_PROXY_TABLE and family in ("ip", "ip6") for family, name in runner.tables())
    except NftError:
        return False
    finally:
        runner.close()
