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
with fakes.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from netagent.errors import NetagentError

NFTABLES = "nftables"
IPTABLES_DEFAULT = "iptables"


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


def choose_proxy_mode(requested: str | None, *, iptables: tuple[bool, str],
                      nftables: tuple[bool, str]) -> tuple[str, str]:
    """The proxy mode to run and a sentence for the log; DataplaneError when the requested
    mode (None: not given) cannot work here. Pure."""
    iptables_ok, iptables_why = iptables
    nftables_ok, nftables_why = nftables
    if requested is None:
        if iptables_ok:
            return IPTABLES_DEFAULT, "--proxy-mode not given: iptables (the default)"
        if nftables_ok:
            return NFTABLES, f"--proxy-mode not given and iptables cannot work here ({iptables_why}): nftables"
        raise DataplaneError(f"neither iptables ({iptables_why}) nor nftables ({nftables_why}) works here")
    if requested == NFTABLES:
        if not nftables_ok:
            raise DataplaneError(f"--proxy-mode nftables: nftables cannot be used here: {nftables_why}")
        return NFTABLES, "--proxy-mode nftables"
    if not iptables_ok:
        hint = "; --proxy-mode nftables works here" if nftables_ok else ""
        raise DataplaneError(f"--proxy-mode {requested} needs iptables (its masquerade and network policy are "
                             f"iptables rules) and iptables cannot work here: {iptables_why}{hint}")
    return requested, f"--proxy-mode {requested}"


@dataclass(frozen=True)
class Dataplane:
    proxy_mode: str
    reason: str            # for the log
    iptables: bool         # iptables works here (nftables mode then keeps a forward accept in it while FORWARD drops)

    @property
    def nftables(self) -> bool:
        return self.proxy_mode == NFTABLES


def resolve_dataplane(requested: str | None) -> Dataplane:
    """`choose_proxy_mode` with this host's probes (nftables probed only when it matters)."""
    iptables = iptables_usable()
    nftables: tuple[bool, str] = (False, "not probed")
    if requested == NFTABLES or (requested is None and not iptables[0]):
        from netagent.kernel.nftables.runner import nftables_usable
        nftables = nftables_usable()
    mode, reason = choose_proxy_mode(requested, iptables=iptables, nftables=nftables)
    return Dataplane(proxy_mode=mode, reason=reason, iptables=iptables[0])
