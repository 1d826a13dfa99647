"""The nftables service-proxy backend (`--proxy-mode nftables`): Services as nft map elements.

Modules, one job each:
- `names`: the table, map, set and chain names, the hook priorities, and why;
- `render`: the pure renderer: a service port's elements and chains (`render_port`), the
  table assembled from them (`Assembly`, kept up to date port by port for partial syncs);
- `batch`: the difference to write (`Changes`) and its text, one transaction per sync;
- `readback`: the table read back from libnftables JSON (full sync, status);
- `backend`: `NftablesProxy`, the `ProxyBackend`.
"""
from proxy.nftables.backend import NftablesProxy
from proxy.nftables.render import NftProxySettings

__all__ = ["NftablesProxy", "NftProxySettings"]
