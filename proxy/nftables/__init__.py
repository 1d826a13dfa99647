"""The nftables service-proxy backend (`--proxy-mode nftables`): Services as nft map elements.

Modules, one job each:
- `names`: the table, map, set and chain names, the hook priorities, and why;
- `spelling`: what differs between the `ip` and `ip6` tables, and the fixed maps and sets;
- `render`: the pure renderer: a service port's elements and chains (`render_port`), the
  fixed and balancing chains, all as `netagent/kernel/nftables` model values;
- `assembly`: the ports put together (`Assembly.table()`: the whole `model.Table`), and a
  partial sync's `changes.Changes` from the changed ports alone;
- `status`: `netagent status services` from the table read back;
- `backend`: `NftablesProxy`, the `ProxyBackend`.
"""
from proxy.nftables.backend import NftablesProxy
from proxy.nftables.render import NftProxySettings

__all__ = ["NftablesProxy", "NftProxySettings"]
