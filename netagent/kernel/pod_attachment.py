"""`PodAttachment`: how a pod's veth is attached to the node, the one enum of it.

The CNI plugin builds the host side by it (the network config's `mode`), the policy engine
hooks each pod's chains by it (the bridge's port or the routed veth), and the daemon
(`--cni-mode`) and `netagent cni install` (`--mode`) write it into the conflist. It lives in
the kernel layer so that `cni/` and `netagent/policy/`, which may not import each other, share
it. Not node routing's `Mode` (vxlan, host-gw, ipip, auto): how packets reach other nodes.

A `str` enum: its value is the conflist's and the command line's text, and it serialises
to JSON as that text.
"""
from __future__ import annotations

import enum


class PodAttachment(str, enum.Enum):
    BRIDGE = "bridge"  # the host veth is a port of the bridge `na0` (owned.DEFAULT_BRIDGE)
    ROUTED = "routed"  # the host veth stands alone: a /32 (/128) route to the pod through it


POD_ATTACHMENT_CHOICES = tuple(attachment.value for attachment in PodAttachment)  # what --cni-mode, --mode accept
