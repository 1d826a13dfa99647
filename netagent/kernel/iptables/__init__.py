"""netagent's iptables layer: every iptables change goes through `iptables-restore`.

The agent never runs one `iptables -A` per rule: like kube-proxy it writes whole chains in one
`iptables-restore --noflush` per sync, which is atomic per table and fast enough for tens of
thousands of rules on the legacy backend (python-iptables would be legacy-only and much slower).

Modules, one job each:
- `backend`: which iptables backend (legacy or nft) the host uses, and the binaries' names;
- `tokens`: one token of rule text: how iptables-restore and ipset restore split a line (as
  measured), and the one escaping every string written into their input goes through
  (`quote_token` refuses control characters, `comment_text` makes a comment safe);
- `restore_format`: the restore/save text format (lines, parsed tables, a restore builder);
- `arguments`: what iptables' option parser refuses in a rule's arguments (the fake's check);
- `runner`: the `Iptables` interface (restore and save, and owned-rule operations built on
  them) and `IptablesRunner`, its subprocess implementation, optionally inside a namespace;
- `fake`: `FakeIptables`, an in-memory implementation that validates restore input the way
  the real tools do (missing chains, busy chains, table/hook restrictions, atomic tables).

Everything netagent owns is named with `OWNED_PREFIX` (`NETAGENT-`); cleanup goes by prefix.
"""
