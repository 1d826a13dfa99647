"""The iptables service-proxy backend: Services as a lean iptables ruleset.

Modules, one job each:
- `names`: chain and set names (prefix NETAGENT-, a hash per service port), and how to
  recognise ours;
- `render`: `render_ruleset(state, settings=...)`, the pure renderer, and the ruleset it
  returns (chains per service port, shared chains, jumps, hairpin set members);
- `backend`: `IptablesProxy`, the `ProxyBackend` that applies rulesets with one
  `iptables-restore --noflush` per sync (full or partial) and cleans up;
- `readback`: what is programmed, read back from iptables-save (status, full sync);
- `tracer`: a packet-flow tracer over any ruleset (tests, benchmark, debugging).
"""
from proxy.iptables.backend import IptablesProxy
from proxy.iptables.render import IptablesProxySettings, MasqueradeScope, Ruleset, render_ruleset

__all__ = ["IptablesProxy", "IptablesProxySettings", "MasqueradeScope", "Ruleset", "render_ruleset"]
