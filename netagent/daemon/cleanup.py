"""`netagent cleanup`: remove what netagent created on this node, and nothing else.

- pod interfaces: ownership is read from the interface alias the plugin sets at creation
  (`netagent:<network>` on host veths, `netagent-bridge` on bridges), never guessed from a
  name alone, so an administrator's own `na...` interface survives. Deleting a host veth
  removes its pod end and the node routes through it;
- node routing: routes carrying our route protocol number and our `na-` VXLAN/IPIP devices
  (their neighbour and FDB entries go with them); `--backend bgp`: our BIRD (by the pid file
  in its state directory; SIGTERM, so peers withdraw our routes) and our BGP table's routes;
- iptables and ip6tables: every `NETAGENT-` chain and every jump to one, on both backends
  (legacy and nft), since a previous run may have used either; then the tunnel source
  filter's ipsets;
- nftables: every table whose name starts with `owned.NFT_TABLE_PREFIX`, in every family
  (the proxy's, the masquerade's and the policy engine's of `--proxy-mode nftables`), in one
  transaction; nothing when the libnftables bindings are not installed (no run of ours could
  have made a table then);
- the service proxy: first its own cleanup (rules, then the ipsets they used, IPVS virtual
  servers on its device and the device), for whichever mode left state behind; eBPF: the
  programs of ours attached to `--cgroup-root` and the maps pinned under `--bpf-root`, when
  those are given (nothing is guessed: the host's /sys/fs/bpf is never scanned).
"""
from __future__ import annotations

from cni.kernel import CniKernel
from netagent.kernel.nftables.runner import Nft


def remove_owned_links(kernel: CniKernel | None = None) -> list[str]:
    """Every node link carrying an alias of ours, through the CNI plugin's kernel seam (which
    reads the aliases of `netagent.kernel.owned`); the names of those actually removed."""
    if kernel is None:
        from cni.netlink_kernel import NetlinkCniKernel
        kernel = NetlinkCniKernel()
    return [link.name for link in kernel.owned_links() if kernel.delete_link(link.name)]


def remove_bgp_state(state_dir: str) -> list[str]:
    from netagent.noderoutes.bgp.learnt import NetlinkLearntRoutes
    from netagent.noderoutes.bgp.supervisor import BirdSupervisor
    bird = BirdSupervisor(state_dir)
    removed = [f"BIRD (pid file {bird.pid_path})"] if bird.pid_path.exists() else []
    bird.stop(withdraw=True)
    table = NetlinkLearntRoutes()
    try:
        return removed + table.flush()
    finally:
        table.close()


def remove_owned_routing() -> list[str]:
    from netagent.noderoutes.routing.kernel import NetlinkKernel
    from netagent.noderoutes.routing.routes import remove_owned_routing as remove
    return remove(NetlinkKernel())


def remove_owned_chains() -> list[str]:
    """Every `NETAGENT-` chain and jump, iptables and ip6tables, on each backend present; then
    the tunnel source filter's ipsets, which no rule names any more."""
    from netagent.kernel.families import IpFamily
    from netagent.kernel.iptables.backend import IptablesBackend, missing_binaries
    from netagent.kernel.iptables.runner import IptablesRunner
    removed = []
    for family in IpFamily:
        for backend in IptablesBackend:
            if missing_binaries(family, backend):
                continue
            removed += [f"{family.command} ({backend.value}) chain {chain}"
                        for chain in IptablesRunner(backend=backend, family=family).delete_owned()]
    return removed + remove_tunnel_filter_sets()


def remove_tunnel_filter_sets() -> list[str]:
    """The tunnel source filter's ipsets (`owned.TUNNEL_FILTER_SET`...); nothing without `ipset`."""
    from netagent.kernel import owned
    from netagent.kernel.ipset.model import IpsetNotInstalled
    from netagent.kernel.ipset.runner import IpsetRunner, delete_owned_sets
    try:
        return [f"ipset {name}" for name in delete_owned_sets(IpsetRunner(), prefix=owned.TUNNEL_FILTER_SET)]
    except IpsetNotInstalled:
        return []


def remove_owned_nft_tables(nft: Nft | None = None) -> list[str]:
    """Delete every nft table of ours (`owned.NFT_TABLE_PREFIX`), all families, one transaction."""
    from netagent.kernel import owned
    from netagent.kernel.nftables.runner import NftError, NftRunner
    from netagent.kernel.nftables.text import UnsafeNftText, name_for_listing
    from netagent.kernel.nftables.model import render_delete
    made = None
    if nft is None:
        try:
            nft = made = NftRunner()
        except NftError:
            return []
    try:
        ours = []
        for family, name in nft.tables():
            if not name.startswith(owned.NFT_TABLE_PREFIX):
                continue
            try:
                ours.append((family, name_for_listing(name)))
            except UnsafeNftText:    # a name we never write: not made by us
                continue
        if ours:
            nft.apply("".join(render_delete(family, name) for family, name in ours))
        return [f"nft table {family} {name}" for family, name in ours]
    finally:
        if made is not None:
            made.close()


def remove_ebpf_state(*, bpf_root: str | None, cgroup: str | None) -> list[str]:
    """Detach our tc filters from this namespace's devices, our programs from `cgroup`, and
    unpin our maps under `bpf_root` (either may be None)."""
    from ebpf.loader import detach_owned, remove_pins
    from ebpf.tc import detach_tc
    removed = detach_tc() + (detach_owned(cgroup) if cgroup else [])
    return removed + (remove_pins(bpf_root) if bpf_root else [])


def remove_proxy_state() -> list[str]:
    """The service proxy's rules, ipsets, IPVS virtual servers and device, on every iptables
    backend present (each backend's own cleanup knows its objects; run before the generic
    chain sweep, since ipsets can only go once no rule references them)."""
    from netagent.kernel.families import IpFamily
    from netagent.kernel.iptables.backend import IptablesBackend, missing_binaries
    from proxy.backend import ProxyMode
    from proxy.factory import build_backend, iptables_families, programmed_mode, spec_for
    removed = []
    for backend in IptablesBackend:
        if missing_binaries(IpFamily.V4, backend):
            continue
        mode = programmed_mode(iptables_backend=backend)
        if mode is not None:
            build_backend(spec_for(mode, iptables_backend=backend)).cleanup()
            removed.append(f"service proxy state ({mode.value}, iptables {backend.value})")
        if mode is ProxyMode.IPVS and not missing_binaries(IpFamily.V6, backend):   # its IPv6 half
            build_backend(spec_for(mode, iptables_backend=backend), family=IpFamily.V6).cleanup()
            removed.append(f"IPv6 service proxy state (ipvs, ip6tables {backend.value})")
        if IpFamily.V6 in iptables_families(iptables_backend=backend):   # the IPv6 proxy's ip6tables chains
            build_backend(spec_for(ProxyMode.IPTABLES, iptables_backend=backend), family=IpFamily.V6).cleanup()
            removed.append(f"IPv6 service proxy state (iptables, ip6tables {backend.value})")
    return removed
