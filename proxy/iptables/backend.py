"""`IptablesProxy`: the iptables service-proxy backend, writing `render_ruleset`'s output.

Full sync (the first, the periodic one, and every one after a failure): one
`iptables-restore --noflush` writes every chain of ours (a `:CHAIN` line creates or empties
it, atomically with its new rules, per table), removes stale per-service chains found in the
kernel (emptied by the same `:CHAIN` mechanism, their parents rewritten in the same input,
then `-X`), and repairs the jumps from the built-in chains, all in that one restore. It
adopts what an earlier agent left: nothing is flushed beforehand, so traffic never meets an
empty table (legacy replaces a table in one call; the nft backend applies a restore as one
transaction). The kernel is read once, cheaply (`read_kernel_view`), to find stale chains and
drifted jumps.

Partial sync (`changed` given, and this backend remembers what it last wrote): only the
chains of the changed service ports are written, plus the shared chains (NETAGENT-SERVICES,
NODEPORTS, the filter chains) whose rendered text changed since the last write; chains of
removed service ports are emptied and deleted. Nothing is read from the kernel, which is
what makes one endpoint change cheap at 10,000 services. Any failure raises (the core then
asks for a full sync) and forgets the memory, so the next sync is full even if the core
did not ask for one.

The hairpin ipset is referenced by a rule, so its order matters: the set is created and
new members added before the restore that may start using them; stale members are
deleted after it; the set itself is destroyed only by `cleanup()`, after every rule that
references it is gone, or when a larger one replaces it (`proxy/hairpin_set.py`: sized from the state,
so `Hash is full` never stops a sync).

One service port the kernel refuses does not cost the others theirs: iptables-restore is
all or nothing, so when it names a refused line that belongs to one service port
(`unprogrammable.py`), that port is left out and the rest written again; it stays out,
reported in `BackendSyncReport.unprogrammed`, until its definition or endpoints change.

One backend programs one IP family, its runner's (`iptables.family`: ip6tables-restore for
IPv6), from states of that family only; a dual-stack node runs two, and each finds and
removes only its own family's chains (the tables are separate) and hairpin sets (named per
family: `names.hairpin_set_name`).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType

from netagent.infra.rejections import printable
from netagent.infra.sync_runner import SyncKind
from netagent.kernel.heap import release_freed_heap
from netagent.kernel.ipset import Ipset, IpsetSpec
from netagent.kernel.ipset.model import DEFAULT_MAX_ELEMENTS, IpsetError
from netagent.kernel.iptables.restore_format import RestoreBuilder, Table, canonical_spec, join_tokens, jump_target
from netagent.kernel.iptables.runner import Iptables, IptablesError, JumpPosition, add_chain_removal, jump_drift
from proxy.backend import BackendSyncReport, ProgrammedService, ProxyBackend, ProxyMode
from proxy import hairpin_set as hairpin
from proxy.iptables.names import PER_SERVICE_CHAIN, hairpin_set_name, is_owned_chain
from proxy.iptables.readback import programmed_services, read_kernel_view
from proxy.iptables.render import (TABLE_ORDER, IptablesProxySettings, RenderedChain, Ruleset, UnrenderablePort,
                                   render_ruleset)
from proxy.iptables.unprogrammable import LeftOut, leave_out_known, owner_of_line, without
from proxy.model import ProxyState, ServicePortName

log = logging.getLogger("netagent.proxy.iptables")

HAIRPIN_COMMENT = hairpin.HAIRPIN_COMMENT
MAX_LEFT_OUT_PER_SYNC = 8   # restores retried in one sync, each without one more refused service port


@dataclass(frozen=True)
class _Applied:
    ruleset: Ruleset
    written: int
    scope: SyncKind


class IptablesProxy(ProxyBackend):
    mode = ProxyMode.IPTABLES

    def __init__(self, *, iptables: Iptables, ipset: Ipset, settings: IptablesProxySettings | None = None,
                 hairpin_minimum: int = DEFAULT_MAX_ELEMENTS):
        self.iptables = iptables
        self.ipset = ipset
        self.family = iptables.family
        if settings is None:
            ports = iptables.port_randomization
            settings = IptablesProxySettings(ports=ports, hairpin_set=hairpin_set_name(self.family))
        self.settings = settings
        self.hairpin_minimum = hairpin_minimum
        self.hairpin_spec = hairpin.hairpin_spec(settings.hairpin_set, hairpin_minimum, minimum=hairpin_minimum,
                                                 family=self.family.ipset)
        self._hairpin_known = False             # hairpin_spec read from the kernel (first full sync)
        self._written: Ruleset | None = None   # what the last successful sync left in the kernel
        self._left_out: dict[ServicePortName, LeftOut] = {}   # refused by the kernel, left out until changed
        self._attempt: Ruleset | None = None   # what the current restore is writing (to find a refused line)

    # ---- sync ---------------------------------------------------------------------------------

    def sync(self, state: ProxyState, *, changed: frozenset[ServicePortName] | None) -> BackendSyncReport:
        """Program `state`; a service port whose lines the kernel refuses is left out (and
        reported in `unprogrammed`) and the rest written again, up to MAX_LEFT_OUT_PER_SYNC
        times per sync; a refusal that names no service port's line raises."""
        if state.family is not self.family:
            raise ValueError(f"an {state.family.label} state for the {self.family.label} iptables backend")
        previous, self._written = self._written, None   # forgotten until this sync succeeds
        state, changed = leave_out_known(state, changed, left_out=self._left_out)
        for attempt in range(MAX_LEFT_OUT_PER_SYNC + 1):
            try:
                applied = self._sync_once(state, changed=changed, previous=previous)
                break
            except (IptablesError, UnrenderablePort) as error:
                if isinstance(error, UnrenderablePort):
                    culprit: ServicePortName | None = error.name
                    reason = f"cannot be rendered: {error.reason}"
                else:
                    culprit = owner_of_line(self._attempt, error.line) if self._attempt is not None else None
                    reason = "iptables-restore: " + (error.message if isinstance(error.message, str) else str(error))
                if culprit is None or culprit not in state.services or attempt == MAX_LEFT_OUT_PER_SYNC:
                    raise
                log.warning("iptables refused the rules of %s (%s): leaving it out, writing the rest",
                            printable(culprit, limit=200), printable(reason, limit=200))
                self._left_out[culprit] = LeftOut(service=state.services[culprit],
                                                  endpoints=state.endpoints_of(culprit), reason=reason)
                state, changed, previous = without(state, {culprit}), None, None
        ruleset = applied.ruleset
        self._written = ruleset
        if applied.scope is SyncKind.FULL:
            release_freed_heap()     # the restore text and the save read back are gone: so is their heap
        unprogrammed = MappingProxyType({name: left.reason for name, left in self._left_out.items()})
        return BackendSyncReport(scope=applied.scope, services_written=applied.written, rules=ruleset.rule_count,
                                 detail=f"{applied.scope.value} sync: {applied.written} service port(s) written, "
                                        f"{ruleset.rule_count} rules, {len(ruleset.hairpin_members)} hairpin "
                                        f"members in {self.hairpin_spec.name}"
                                        + (f", {len(unprogrammed)} left out" if unprogrammed else ""),
                                 unprogrammed=unprogrammed)

    def _sync_once(self, state: ProxyState, *, changed: frozenset[ServicePortName] | None,
                   previous: Ruleset | None) -> _Applied:
        self._attempt = None
        if changed is not None and previous is not None and previous.node == state.node:
            ruleset = render_ruleset(state, settings=self.settings, reuse=previous, changed=changed)
            ruleset, written = self._apply_partial(ruleset, previous, changed)
            return _Applied(ruleset, written, SyncKind.PARTIAL)
        ruleset = render_ruleset(state, settings=self.settings)
        ruleset, written = self._apply_full(ruleset)
        return _Applied(ruleset, written, SyncKind.FULL)

    def _adopt_hairpin(self) -> list[str]:
        """Our hairpin sets in the kernel; the first time, the largest becomes the current one."""
        base = self.settings.hairpin_set
        found = [name for name in self.ipset.owned_names(prefix=base) if hairpin.is_hairpin_set(base, name)]
        if not self._hairpin_known and found:
            sizes = {}
            for name in found:
                info = self.ipset.describe(name)
                if info is not None:
                    sizes[name] = info.max_elements or hairpin.capacity_of(base, name, minimum=self.hairpin_minimum)
            if sizes:
                name = max(sizes, key=lambda n: (sizes[n], n))
                self.hairpin_spec = IpsetSpec(name, self.hairpin_spec.type, comment=HAIRPIN_COMMENT,
                                              max_elements=sizes[name], family=self.family.ipset)
        self._hairpin_known = True
        return found

    def _destroy_obsolete(self, names: Iterable[str]) -> None:
        for name in names:
            if name != self.hairpin_spec.name:
                try:
                    self.ipset.destroy(name)
                except IpsetError as error:   # still referenced (a failed restore): the next full sync retries
                    log.warning("could not remove the old hairpin set %s: %s", name, error)

    def _apply_full(self, ruleset: Ruleset) -> tuple[Ruleset, int]:
        views = {table: read_kernel_view(self.iptables.save(table)).get(table) or Table(table)
                 for table in TABLE_ORDER}
        existing = self._adopt_hairpin()
        members = ruleset.hairpin_members
        self.hairpin_spec = hairpin.choose(self.settings.hairpin_set, len(members), current=self.hairpin_spec,
                                           minimum=self.hairpin_minimum, family=self.family.ipset)
        ruleset = ruleset.with_hairpin_set(self.hairpin_spec.name)
        self._attempt = ruleset
        self.ipset.ensure_set(self.hairpin_spec)
        present = self.ipset.members(self.hairpin_spec.name)
        self.ipset.update(self.hairpin_spec.name, add=members - present)
        self.iptables.restore(render_full_restore(ruleset, views))
        self.ipset.update(self.hairpin_spec.name, remove=present - members)
        self._destroy_obsolete(existing)
        return ruleset, len(ruleset.ports)

    def _apply_partial(self, ruleset: Ruleset, previous: Ruleset,
                       changed: Iterable[ServicePortName]) -> tuple[Ruleset, int]:
        old_spec = self.hairpin_spec
        self.hairpin_spec = hairpin.choose(self.settings.hairpin_set, len(ruleset.hairpin_members),
                                           current=old_spec, minimum=self.hairpin_minimum, family=self.family.ipset)
        ruleset = ruleset.with_hairpin_set(self.hairpin_spec.name)
        self._attempt = ruleset
        write: list[RenderedChain] = []
        delete: list[RenderedChain] = []
        written = 0
        for name in sorted(set(changed), key=lambda n: (n.namespace, n.name, n.port)):
            new = ruleset.ports.get(name)
            old = previous.ports.get(name)
            new_chains = new.chains if new is not None else ()
            written += new is not None or old is not None
            write.extend(new_chains)
            kept = {chain.name for chain in new_chains}
            delete.extend(chain for chain in (old.chains if old is not None else ()) if chain.name not in kept)
        before = {(chain.table, chain.name): chain for chain in previous.shared}
        write.extend(chain for chain in ruleset.shared if before.get((chain.table, chain.name)) != chain)
        grown = self.hairpin_spec != old_spec
        adding: Iterable[str]
        removing: Iterable[str]
        if grown:   # a larger set, filled whole before the restore points the rule at it
            self.ipset.ensure_set(self.hairpin_spec)
            adding, removing = ruleset.hairpin_members, ()
        else:
            adding = ruleset.hairpin_members - previous.hairpin_members
            removing = previous.hairpin_members - ruleset.hairpin_members
        if adding:
            self.ipset.update(self.hairpin_spec.name, add=adding)
        text = render_partial_restore(write, delete)
        if text:
            self.iptables.restore(text)
        if removing:
            self.ipset.update(self.hairpin_spec.name, remove=removing)
        if grown:
            self._destroy_obsolete([old_spec.name])
        return ruleset, written

    # ---- read back and clean up ----------------------------------------------------------------

    def programmed(self) -> list[ProgrammedService]:
        return programmed_services(self.iptables.tables())

    def cleanup(self) -> None:
        """Every chain of ours and the jumps to them, in one restore; then the hairpin set.
        masquerade.py's NETAGENT-POSTRTG and NETAGENT-FORWARD are not ours and stay."""
        self._written = None
        builder = RestoreBuilder()
        for table_name in TABLE_ORDER:
            table = self.iptables.table(table_name)
            add_chain_removal(builder, table, {name for name in table.chains if is_owned_chain(name)})
        if builder:
            self.iptables.restore(builder.text())
        base = self.settings.hairpin_set
        for name in self.ipset.owned_names(prefix=base):
            if hairpin.is_hairpin_set(base, name):
                self.ipset.destroy(name)


# ---- restore text -------------------------------------------------------------------------------

def render_full_restore(ruleset: Ruleset, views: dict[str, Table]) -> str:
    """Everything in `ruleset`, stale per-service chains removed, built-in jumps repaired;
    `views` are the tables as `read_kernel_view` saw them."""
    out: list[str] = []
    for table_name in TABLE_ORDER:
        view = views.get(table_name) or Table(table_name)
        chains = ruleset.chains(table_name)
        wanted = {chain.name for chain in chains}
        stale = sorted(name for name in view.chains if PER_SERVICE_CHAIN.match(name) and name not in wanted)
        out.append(f"*{table_name}")
        out.extend(chain.declaration for chain in chains)
        out.extend(f":{name} - [0:0]" for name in stale)
        for chain in chains:
            out.extend(chain.rules)
        doomed = set(stale)
        for holder_name, holder in view.chains.items():   # foreign rules jumping into stale chains
            if holder_name in doomed:
                continue
            out.extend(f"-D {holder_name} {join_tokens(rule)}" for rule in holder.rules
                       if jump_target(rule) in doomed)
        for jump in ruleset.jumps:
            if jump.table != table_name:
                continue
            spec = canonical_spec(jump.spec)
            if jump_drift(view, jump.chain, spec, position=JumpPosition.FIRST):
                out.extend(f"-D {jump.chain} {join_tokens(rule)}" for rule in
                           (view.chains[jump.chain].rules if jump.chain in view.chains else ())
                           if jump_target(rule) == jump.target)
                out.append(f"-I {jump.chain} 1 {join_tokens(spec)}")
        out.extend(f"-X {name}" for name in stale)
        out.append("COMMIT")
    return "\n".join(out) + "\n"


def render_partial_restore(write: Iterable[RenderedChain], delete: Iterable[RenderedChain]) -> str:
    """Rewrite `write`, empty and delete `delete`; only the tables that have something."""
    write, delete = list(write), list(delete)
    out: list[str] = []
    for table_name in TABLE_ORDER:
        writing = [chain for chain in write if chain.table == table_name]
        deleting = [chain for chain in delete if chain.table == table_name]
        if not writing and not deleting:
            continue
        out.append(f"*{table_name}")
        out.extend(chain.declaration for chain in writing)
        out.extend(chain.declaration for chain in deleting)
        for chain in writing:
            out.extend(chain.rules)
        out.extend(f"-X {chain.name}" for chain in deleting)
        out.append("COMMIT")
    return "\n".join(out) + "\n" if out else ""
