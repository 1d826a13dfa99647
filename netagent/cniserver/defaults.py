"""The CNI side's default paths, alone so that parsing `netagent` arguments (their defaults)
imports no module that does the work (`install.py`, the server): the CLI stays lazy.

`DEFAULT_DATA_DIR` is host-local IPAM's directory, the same as `cni/ipam/config.py`'s
(a unit test holds them equal; importing that module here would cost the CLI ~20 ms).
"""
from __future__ import annotations

DEFAULT_SOCKET = "/run/netagent/cni.sock"
DEFAULT_DATA_DIR = "/var/lib/cni/networks"
