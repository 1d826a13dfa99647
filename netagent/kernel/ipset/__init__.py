"""netagent's ipset layer: our sets in one network namespace, changed with one `ipset restore`.

Modules, one job each (the same split as `netagent.kernel.iptables`):
- `model`: set types, specs, what the kernel reports about a set, and the one spelling of a
  member (`canonical_member`, `entry`); pure;
- `restore`: the text: `ipset restore` input netagent writes, `ipset save` / `ipset list -t`
  output it reads; pure;
- `runner`: the `Ipset` interface (an ABC), `sync_set`, `sync_sets`, `replace_set` and
  `delete_owned_sets` built on it, and `IpsetRunner`, which runs the `ipset` binary,
  optionally in a namespace;
- `fake`: `FakeIpset`, in-memory sets that refuse what the kernel refuses, and
  `iptables_references` to make a fake iptables' `--match-set` rules hold sets.

The names callers use are re-exported here, so `from netagent.kernel.ipset import ...` keeps
working as it did when this was one module.
"""
from netagent.kernel.ipset.fake import FakeIpset, iptables_references
from netagent.kernel.ipset.model import (
    IpsetError,
    IpsetInfo,
    IpsetNotInstalled,
    IpsetSpec,
    IpsetType,
    IpsetWrite,
    SetContents,
    canonical_member,
    entry,
)
from netagent.kernel.ipset.restore import create_arguments, parse_header, parse_list, parse_save
from netagent.kernel.ipset.runner import (
    Ipset,
    IpsetRunner,
    delete_owned_sets,
    replace_set,
    sync_set,
    sync_sets,
)

__all__ = [
    "FakeIpset", "Ipset", "IpsetError", "IpsetInfo", "IpsetNotInstalled", "IpsetRunner", "IpsetSpec", "IpsetType",
    "IpsetWrite", "SetContents", "canonical_member", "create_arguments", "delete_owned_sets", "entry",
    "iptables_references", "parse_header", "parse_list", "parse_save", "replace_set", "sync_set", "sync_sets",
]
