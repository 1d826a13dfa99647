"""The hash that names a service port's own kernel objects, shared by every proxy backend.

`service_hash`: the first 15 characters of base32(sha256("namespace/name:port/PROTOCOL")),
so the same service port always gets the same names (a restarted agent adopts them) and a
name holds only `[A-Z2-7]`: the iptables backend's `NETAGENT-SVC-<hash>` chains, the nftables
backend's affinity chains and sets (`AFF-<hash>-C`). `text_hash` is the same digest of any
text (the iptables backend's endpoint chains hash the endpoint in).
"""
from __future__ import annotations

import base64
import functools
import hashlib

from proxy.model import Protocol, ServicePortName

HASH_LENGTH = 15


def text_hash(text: str) -> str:
    # 10 bytes are 16 base32 characters: enough for 15 without encoding the whole digest.
    return base64.b32encode(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:10]).decode()[:HASH_LENGTH]


@functools.lru_cache(maxsize=65536)
def service_hash(name: ServicePortName, protocol: Protocol) -> str:
    return text_hash(f"{name}/{protocol.value}")
