"""Which iptables backend this host uses, and the names of its binaries.

Since iptables 1.8 there are two backends behind the same command line: `legacy` (the
x_tables kernel API) and `nft` (nf_tables). Both can hold rules at the same time and the
kernel evaluates both, but each tool only sees its own rules; a node agent that programs the
other backend than kubelet, kube-proxy and the container runtime ends up with half its
rules invisible to `iptables-save` and an ordering between the two it does not control.

Detection follows the reasoning the Kubernetes components use (described in kube-proxy's
documentation and the iptables-wrappers project), implemented here from that description:

1. kubelet leaves marker chains (`KUBE-IPTABLES-HINT`, `KUBE-KUBELET-CANARY`) in the
   backend it uses; if the nft backend has one, use nft, else if legacy has one, use legacy;
2. otherwise the backend holding more rules is the one the host's tools use (ties go to nft);
3. an empty host is nft: every current distribution defaults to it.

The choice is computed in the current network namespace, or in another one through an argv
prefix (`ip netns exec NAME`), because the agent runs in its node's namespace and tests run
in throwaway ones. An explicit `--iptables-backend legacy|nft|auto` is resolved by
`resolve_backend`; the caller owns the flag.
"""
from __future__ import annotations

import enum
import logging
import shutil
import subprocess
from collections.abc import Sequence

from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.tokens import run_tool
from netagent.errors import NetagentError

log = logging.getLogger("netagent.kernel.iptables")

KUBELET_HINT_CHAINS = frozenset({"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"})
DETECTION_TIMEOUT_SECONDS = 30


class IptablesBackend(enum.Enum):
    LEGACY = "legacy"
    NFT = "nft"


class BackendChoice(enum.Enum):
    """The operator's `--iptables-backend` value."""
    AUTO = "auto"
    LEGACY = "legacy"
    NFT = "nft"


class IptablesTool(enum.Enum):
    MAIN = ""
    RESTORE = "-restore"
    SAVE = "-save"


class IptablesNotInstalled(NetagentError, RuntimeError):
    """A binary the chosen backend needs is missing from PATH."""


def binary_name(family: IpFamily, backend: IptablesBackend, tool: IptablesTool) -> str:
    """`iptables-nft-restore`, `ip6tables-legacy-save`, ..."""
    return f"{family.command}-{backend.value}{tool.value}"


def missing_binaries(family: IpFamily, backend: IptablesBackend) -> list[str]:
    return [binary_name(family, backend, tool) for tool in IptablesTool
            if shutil.which(binary_name(family, backend, tool)) is None]


def require_binaries(family: IpFamily, backend: IptablesBackend) -> None:
    missing = missing_binaries(family, backend)
    if missing:
        raise IptablesNotInstalled(
            f"the {backend.value} iptables backend needs {', '.join(missing)}, not found in PATH "
            f"(Debian and Ubuntu ship them in the `iptables` package)")


def choose_backend(saves: dict[IptablesBackend, str | None]) -> tuple[IptablesBackend, str]:
    """Pure decision from each installed backend's `*-save` output (None: not installed or
    unreadable). Returns the backend and a sentence saying why, for the log."""
    readable = {backend: text for backend, text in saves.items() if text is not None}
    if not readable:
        raise IptablesNotInstalled("neither iptables-legacy-save nor iptables-nft-save could be run")
    if len(readable) == 1:
        (only,) = readable
        return only, f"only the {only.value} backend is usable here"
    for backend in (IptablesBackend.NFT, IptablesBackend.LEGACY):
        hints = _declared_chains(readable[backend]) & KUBELET_HINT_CHAINS
        if hints:
            return backend, f"kubelet's {sorted(hints)[0]} chain is in the {backend.value} tables"
    legacy_rules = _rule_count(readable[IptablesBackend.LEGACY])
    nft_rules = _rule_count(readable[IptablesBackend.NFT])
    if legacy_rules > nft_rules:
        return IptablesBackend.LEGACY, f"legacy holds more rules ({legacy_rules} vs {nft_rules})"
    if nft_rules:
        return IptablesBackend.NFT, f"nft holds at least as many rules ({nft_rules} vs {legacy_rules})"
    return IptablesBackend.NFT, "no rules in either backend; nft is the default"


def detect_backend(*, family: IpFamily = IpFamily.V4,
                   exec_prefix: Sequence[str] = ()) -> IptablesBackend:
    """Detect the backend in the namespace `exec_prefix` runs in (the current one if empty)."""
    saves = {backend: _read_save(family, backend, exec_prefix) for backend in IptablesBackend}
    backend, reason = choose_backend(saves)
    log.info("iptables backend: %s (%s)", backend.value, reason)
    return backend


def resolve_backend(choice: BackendChoice | str, *, family: IpFamily = IpFamily.V4,
                    exec_prefix: Sequence[str] = ()) -> IptablesBackend:
    """Turn `--iptables-backend` into a backend: detect for auto, check binaries for the rest."""
    choice = BackendChoice(choice)
    if choice is BackendChoice.AUTO:
        backend = detect_backend(family=family, exec_prefix=exec_prefix)
    else:
        backend = IptablesBackend(choice.value)
    require_binaries(family, backend)
    return backend


def _read_save(family: IpFamily, backend: IptablesBackend, exec_prefix: Sequence[str]) -> str | None:
    save = binary_name(family, backend, IptablesTool.SAVE)
    if shutil.which(save) is None:
        return None
    # Without -t, legacy-save dumps only tables already loaded, so detecting never creates one.
    try:
        done = run_tool([*exec_prefix, save], timeout=DETECTION_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        log.warning("%s timed out during backend detection", save)
        return None
    if done.returncode != 0:
        log.warning("%s failed during backend detection: %s", save, done.stderr.strip())
        return None
    return done.stdout


def _declared_chains(save_text: str) -> set[str]:
    return {line[1:].split()[0] for line in save_text.split("\n")
            if line.startswith(":") and len(line) > 1}


def _rule_count(save_text: str) -> int:
    return sum(1 for line in save_text.split("\n") if line.startswith("-A "))
