"""The network configuration the runtime hands us on stdin, parsed and validated.

Decoding problems are code 6, missing or ill-typed keys code 7, an unknown cniVersion
code 1. The IPAM section is kept as a raw dict here and validated by `cni.ipam.config`,
because the standalone IPAM binary and delegated IPAM plugins read it too.
"""
from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cni import version as cni_version
from cni import wire
from cni.errors import CniError, ErrorCode
from cni.request import interface_name_problem, valid_identifier
from cni.result_schema import validate_dns, validate_prev_result
from netagent.kernel import owned
from netagent.kernel.pod_attachment import PodAttachment

if TYPE_CHECKING:
    from cni.ipam.config import IpamConf

DEFAULT_BRIDGE = owned.DEFAULT_BRIDGE
DEFAULT_MTU = 1500
BUILTIN_IPAM_TYPES = ("netagent", "netagent-ipam")
# The host veth's alias is "netagent:<name>"; the kernel takes an IFLA_IFALIAS attribute of at
# most 255 bytes (IFALIASZ - 1) and ours carries a terminating NUL, so 254 bytes of text. The
# IPAM directory <dataDir>/<name> stays within NAME_MAX (255) with it.
MAX_ALIAS = 254
MAX_NETWORK_NAME = MAX_ALIAS - len(owned.VETH_ALIAS_PREFIX)
# Deeper than this is no network configuration; Python's parser would hit its recursion
# limit near 1000 levels, so the bound is explicit and the answer a clear code 6.
MAX_JSON_DEPTH = 512
_OPENERS = (ord("["), ord("{"))
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class ConfigScope(str, enum.Enum):
    """Which keys a parse validates: all of ours, or only what an IPAM plugin owns.

    An IPAM plugin receives the main plugin's whole config (macvlan's `"mode": "vepa"`,
    ipvlan's `"mode": "l3"`, ...); those keys are not ours to judge.
    """
    PLUGIN = "plugin"
    IPAM = "ipam"


@dataclass(frozen=True)
class NetConf:
    cni_version: str
    name: str
    type: str
    mode: PodAttachment = PodAttachment.BRIDGE  # the conflist's "mode"
    bridge: str = DEFAULT_BRIDGE
    mtu: int = DEFAULT_MTU
    hairpin_mode: bool = False
    agent_socket: str = ""
    ipam: dict = field(default_factory=dict)
    dns: dict = field(default_factory=dict)
    runtime_config: dict = field(default_factory=dict)
    prev_result: dict | None = None
    raw: dict = field(default_factory=dict)

    @property
    def ipam_type(self) -> str:
        return self.ipam.get("type", "")

    @property
    def ipam_is_builtin(self) -> bool:
        return self.ipam_type in BUILTIN_IPAM_TYPES

    def builtin_ipam(self) -> IpamConf:
        """The `ipam` section parsed for our IPAM (cni/ipam/config.py), once per config: an ADD
        validates it before any lock and allocates with the same value. CniError (code 7) when
        it is unusable; a failed parse is not kept."""
        parsed = self.__dict__.get("_builtin_ipam")
        if parsed is None:
            from cni.ipam.config import parse_ipam_config
            parsed = parse_ipam_config(self.ipam, network_name=self.name, runtime_config=self.runtime_config)
            object.__setattr__(self, "_builtin_ipam", parsed)   # a cache, not a field: frozen stays true
        return parsed


def json_depth(data: bytes) -> int:
    """How deeply arrays and objects nest in a JSON text (brackets inside strings ignored)."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for byte in brackets:
        if byte in _OPENERS:
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def decode_json_object(data: bytes, what: str = "network configuration") -> dict:
    too_deep = CniError(ErrorCode.DECODE_FAILURE, f"cannot decode the {what}",
                        f"it nests arrays and objects more than {MAX_JSON_DEPTH} levels deep")
    if data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH and json_depth(data) > MAX_JSON_DEPTH:
        raise too_deep
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CniError(ErrorCode.DECODE_FAILURE, f"cannot decode the {what}", str(exc)) from None
    except RecursionError:
        raise too_deep from None
    if not isinstance(obj, dict):
        raise CniError(ErrorCode.DECODE_FAILURE, f"the {what} must be a JSON object")
    return obj


def _typed(raw: dict, key: str, kind, default):
    value = raw.get(key, default)
    if value is None:
        return default
    # bool is an int in Python; a config saying "mtu": true is still wrong.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise CniError(ErrorCode.INVALID_CONFIG, f"{key!r} must be of type {names}",
                       f"got {type(value).__name__}: {value!r}")
    return value


def peek_version(raw: dict) -> str:
    """The config's cniVersion if we speak it, else the latest (for error replies)."""
    v = raw.get("cniVersion")
    return v if v in cni_version.SUPPORTED_VERSIONS else cni_version.LATEST


def parse_netconf(data: bytes, *, require_ipam: bool = True, scope: ConfigScope = ConfigScope.PLUGIN) -> NetConf:
    raw = decode_json_object(data)
    version = cni_version.require_supported(raw.get("cniVersion"))
    name = _typed(raw, "name", str, "")
    if not name:
        raise CniError(ErrorCode.INVALID_CONFIG, "'name' is required")
    if not valid_identifier(name) or len(name) > MAX_NETWORK_NAME:
        raise CniError(ErrorCode.INVALID_CONFIG, f"network name {name[:64]!r} is not valid",
                       f"it must match [a-zA-Z0-9][a-zA-Z0-9_.-]* and be at most {MAX_NETWORK_NAME} "
                       f"characters (the host veth's alias is 'netagent:<name>', at most {MAX_ALIAS} bytes)")
    plugin_type = _typed(raw, "type", str, "")
    if not plugin_type:
        raise CniError(ErrorCode.INVALID_CONFIG, "'type' is required")
    ipam = _typed(raw, "ipam", dict, {})
    if require_ipam and not (isinstance(ipam.get("type"), str) and ipam["type"]):
        raise CniError(ErrorCode.INVALID_CONFIG, "'ipam.type' is required")
    prev = validate_prev_result(raw.get("prevResult"))
    common = dict(cni_version=version, name=name, type=plugin_type, ipam=ipam,
                  runtime_config=_typed(raw, "runtimeConfig", dict, {}), prev_result=prev, raw=raw)
    if scope is ConfigScope.IPAM:
        return NetConf(**common)

    mode_text = _typed(raw, "mode", str, PodAttachment.BRIDGE.value)
    try:
        mode = PodAttachment(mode_text)
    except ValueError:
        raise CniError(ErrorCode.INVALID_CONFIG, f"'mode' must be 'bridge' or 'routed', not {mode_text!r}") from None
    bridge = _typed(raw, "bridge", str, DEFAULT_BRIDGE)
    problem = interface_name_problem(bridge)
    if problem:
        raise CniError(ErrorCode.INVALID_CONFIG, f"bridge name {bridge!r} {problem}")
    mtu = _typed(raw, "mtu", int, DEFAULT_MTU)
    if not 68 <= mtu <= 65535:
        raise CniError(ErrorCode.INVALID_CONFIG, f"'mtu' {mtu} is outside 68..65535")
    return NetConf(
        **common, mode=mode, bridge=bridge, mtu=mtu,
        hairpin_mode=_typed(raw, "hairpinMode", bool, False),
        agent_socket=_agent_socket(raw), dns=validate_dns(_typed(raw, "dns", dict, {}), "dns"))


def _agent_socket(raw: dict) -> str:
    path = _typed(raw, "agentSocket", str, "")
    problem = wire.socket_path_problem(path) if path else None
    if problem:
        raise CniError(ErrorCode.INVALID_CONFIG, problem, path[:200])
    return path
