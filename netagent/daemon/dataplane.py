"""Which netfilter dataplane `netagent run` uses: iptables (with the iptables, IPVS and eBPF
proxies) or nftables (`--proxy-mode nftables`: Services, masquerade and NetworkPolicy in our
nft tables, no iptables rule of ours).

Why a decision at all. Rocky/RHEL 10 ship no iptables, and a kernel may lack xtables (the
x_tables core iptables needs on either backend: legacy's tables, and the `-m`/`-j`
extensions iptables-nft runs through nft_compat). There every mode but nftables would fail
on its first rule, so when `--proxy-mode` is not given the default becomes nftables by
itself, and the log says why; when the flag asks for a mode that needs iptables (every mode
but nftables: their masquerade and NetworkPolicy are iptables rules) on such a host, the
answer is a clear error rather than a crash loop.

`iptables_usable()` probes (binaries of either backend, a kernel with xtables), pure
`choose_proxy_mode()` decides; both take their readers as arguments so the unit tests decide
with fakes. The decision is made once, by `resolve_dataplane` at start, and handed on as a
`Dataplane`: the proxy mode that runs (a `ProxyMode`, or `NO_PROXY`) and the `Netfilter`
dataplane every part programs (the proxy's, masquerade's, NetworkPolicy's and anti-spoofing's
rules).
"""
from __future__ import annotations

import enum
import os
from collections.abc import Callable
from dataclasses import dataclass

from netagent.daemon.config import NoProxy
from netagent.errors import NetagentError
from proxy.backend import ProxyMode


class Netfilter(enum.Enum):
    """The netfilter dataplane of this run: iptables (and ipset) rules, or our nftables tables."""
    IPTABLES = "iptables"
    NFTABLES = "nftables"


class DataplaneError(NetagentError, RuntimeError):
    """The proxy mode asked for cannot work on this host."""


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def kernel_has_xtables(*, release: str | None = None, exists: Callable[[str], bool] = os.path.exists,
                       read: Callable[[str], str | None] = _read) -> tuple[bool, str]:
    """x_tables is in this kernel: loaded or built in (`/proc/net/ip_tables_names`), or a
    module of this release that could be loaded (`modules.dep`) or built in (`modules.builtin`)."""
    if exists("/proc/net/ip_tables_names"):
        return True, "ip_tables is loaded"
    release = release or os.uname().release
    for listing in ("modules.builtin", "modules.dep"):
        text = read(f"/lib/modules/{release}/{listing}") or ""
        if "/x_tables.ko" in text and "/ip_tables.ko" in text:
            return True, f"x_tables and ip_tables are in {listing}"
    return False, f"the kernel ({release}) has no xtables (no /proc/net/ip_tables_names, no ip_tables module)"


def iptables_usable(*, missing: Callable[[], list[list[str]]] | None = None,
                    xtables: Callable[[], tuple[bool, str]] = kernel_has_xtables) -> tuple[bool, str]:
    """Can iptables work here: some backend's binaries are installed and the kernel has
    xtables. (True, what was found) or (False, why not). Reads only."""
    if missing is None:
        from netagent.kernel.families import IpFamily
        from netagent.kernel.iptables.backend import IptablesBackend, missing_binaries

        def missing() -> list[list[str]]:
            return [missing_binaries(IpFamily.V4, backend) for backend in IptablesBackend]
    absent = missing()
    if all(absent):
        names = sorted({name for names in absent for name in names})
        return False, f"no iptables binaries ({', '.join(names)} not found)"
    has, why = xtables()
    return (True, why) if has else (False, why)


def choose_proxy_mode(requested: ProxyMode | NoProxy | None, *, iptables: tuple[bool, str],
                      nftables: tuple[bool, str]) -> tuple[ProxyMode | NoProxy, str]:
    """The proxy mode to run and a sentence for the log; DataplaneError when the requested
    mode (None: not given) cannot work here. Pure."""
    iptables_ok, iptables_why = iptables
    nftables_ok, nftables_why = nftables
    if requested is None:
        if iptables_ok:
            return ProxyMode.IPTABLES, "--proxy-mode not given: iptables (the default)"
        if nftables_ok:
            return ProxyMode.NFTABLES, f"--proxy-mode not given and iptables cannot work here ({iptables_why}): nftables"
        raise DataplaneError(f"neither iptables ({iptables_why}) nor nftables ({nftables_why}) works here")
    if requested is ProxyMode.NFTABLES:
        if not nftables_ok:
            raise DataplaneError(f"--proxy-mode nftables: nftables cannot be used here: {nftables_why}")
        return ProxyMode.NFTABLES, "--proxy-mode nftables"
    if not iptables_ok:
        hint = "; --proxy-mode nftables works here" if nftables_ok else ""
        raise DataplaneError(f"--proxy-mode {requested.value} needs iptables (its masquerade and network policy are "
                             f"iptables rules) and iptables cannot work here: {iptables_why}{hint}")
    return requested, f"--proxy-mode {requested.value}"


@dataclass(frozen=True)
class Dataplane:
    proxy_mode: ProxyMode | NoProxy   # the mode that runs (NO_PROXY: --proxy-mode none)
    reason: str            # for the log
    iptables: bool         # iptables works here (nftables mode then keeps a forward accept in it while FORWARD drops)

    @property
    def netfilter(self) -> Netfilter:
        """nftables with `--proxy-mode nftables` (or chosen for it), iptables with every other mode."""
        return Netfilter.NFTABLES if self.proxy_mode is ProxyMode.NFTABLES else Netfilter.IPTABLES

    @property
    def nftables(self) -> bool:
        return self.netfilter is Netfilter.NFTABLES

    @property
    def proxy(self) -> ProxyMode | None:
        """The proxy's backend; None with `--proxy-mode none`."""
        return self.proxy_mode if isinstance(self.proxy_mode, ProxyMode) else None


def resolve_dataplane(requested: ProxyMode | NoProxy | None) -> Dataplane:
    """`choose_proxy_mode` with this host's probes (nftables probed only when it matters)."""
    iptables = iptables_usable()
    nftables: tuple[bool, str] = (False, "not probed")
    if requested is ProxyMode.NFTABLES or (requested is None and not iptables[0]):
        from netagent.kernel.nftables.runner import nftables_usable
        nftables = nftables_usable()
    mode, reason = choose_proxy_mode(requested, iptables=iptables, nftables=nftables)
    return Dataplane(proxy_mode=mode, reason=reason, iptables=iptables[0])
