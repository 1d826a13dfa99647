"""One CNI invocation, read from the environment and stdin, and validated.

The runtime passes everything through `CNI_*` variables; anything missing or hostile is
rejected here with code 4 before any file or interface is named after it. Container IDs,
interface names and network names end up in file paths and interface aliases, so they
follow libcni's rules: no path separators, no shell characters, bounded length.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from cni.errors import CniError, ErrorCode

COMMANDS = ("ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION")
_REQUIRED = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME"),
    "GC": ("CNI_PATH",),
    "STATUS": (),
    "VERSION": (),
}
# fullmatch, never match with `$`: `$` also matches before a final newline, and "abc\n" must
# not pass for "abc" (its reservation's owner text would be abc's after trimming).
_SAFE_ID = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*")
MAX_ID_LENGTH = 1024
IFNAME_MAX = 15  # IFNAMSIZ - 1
# names the kernel gives a meaning of its own (/proc/sys/net/*/conf/all, .../default)
RESERVED_IFNAMES = frozenset({"all", "default"})


def valid_identifier(value: str) -> bool:
    """libcni's rule for container IDs and network names."""
    return len(value) <= MAX_ID_LENGTH and _SAFE_ID.fullmatch(value) is not None


def interface_name_problem(name: str) -> str | None:
    """Why `name` is not acceptable as an interface name, or None when it is.

    Stricter than the kernel (which refuses only '/', ':' and white space): the names
    show up in logs, tools and scripts, so shell metacharacters are refused too.
    """
    if not name:
        return "is empty"
    if len(name) > IFNAME_MAX:
        return f"is longer than {IFNAME_MAX} characters"
    if _SAFE_ID.fullmatch(name) is None:
        return "must start with a letter or digit and contain only letters, digits, '_', '.' and '-'"
    if name in RESERVED_IFNAMES:
        return "is reserved by the kernel (/proc/sys/net/ipv4/conf/" + name + ")"
    return None


@dataclass(frozen=True)
class CniRequest:
    command: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: dict = field(default_factory=dict)
    path: tuple = ()
    config_bytes: bytes = b""

    @property
    def pod_name(self) -> str:
        return self.args.get("K8S_POD_NAME", "")

    @property
    def pod_namespace(self) -> str:
        return self.args.get("K8S_POD_NAMESPACE", "")


def parse_cni_args(text: str) -> dict:
    """`K=V;K2=V2` -> dict. A pair without '=' is an invalid environment."""
    out: dict = {}
    for pair in filter(None, text.split(";")):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CniError(ErrorCode.INVALID_ENVIRONMENT, f"CNI_ARGS: malformed pair {pair!r}",
                           "expected KEY=VALUE pairs separated by ';'")
        out[key] = value
    return out


def _require_utf8(environ) -> None:
    """Every CNI_* value must be text: the shim relays raw bytes and the Python client
    surrogate-escapes them, so a non-UTF-8 byte is refused the same way on every path."""
    for key, value in environ.items():
        if isinstance(key, str) and key.startswith("CNI_") and isinstance(value, str):
            try:
                (key + value).encode("utf-8")
            except UnicodeEncodeError:
                raise CniError(ErrorCode.INVALID_ENVIRONMENT, f"{key!r} is not valid UTF-8",
                               "the CNI_* variables must be UTF-8 text") from None


def request_from_environment(environ: dict, stdin: bytes) -> CniRequest:
    _require_utf8(environ)
    command = environ.get("CNI_COMMAND", "")
    if not command:
        raise CniError(ErrorCode.INVALID_ENVIRONMENT, "CNI_COMMAND is not set")
    if command not in COMMANDS:
        raise CniError(ErrorCode.INVALID_ENVIRONMENT, f"CNI_COMMAND {command!r} is not one of "
                       + ", ".join(COMMANDS))
    for name in _REQUIRED[command]:
        if not environ.get(name):
            raise CniError(ErrorCode.INVALID_ENVIRONMENT, f"{name} is required for {command}")

    container_id = environ.get("CNI_CONTAINERID", "")
    if container_id and not valid_identifier(container_id):
        raise CniError(ErrorCode.INVALID_ENVIRONMENT, "CNI_CONTAINERID is not a valid container ID",
                       "it must match [a-zA-Z0-9][a-zA-Z0-9_.-]* and be at most "
                       f"{MAX_ID_LENGTH} characters")
    ifname = environ.get("CNI_IFNAME", "")
    if ifname:
        problem = interface_name_problem(ifname)
        if problem:
            raise CniError(ErrorCode.INVALID_ENVIRONMENT, f"CNI_IFNAME {ifname!r} {problem}")
    netns = environ.get("CNI_NETNS", "")
    if netns and ("\0" in netns or not netns.startswith("/")):
        raise CniError(ErrorCode.INVALID_ENVIRONMENT, "CNI_NETNS must be an absolute path")
    path = tuple(p for p in environ.get("CNI_PATH", "").split(":") if p)
    return CniRequest(command=command, container_id=container_id, netns=netns, ifname=ifname,
                      args=parse_cni_args(environ.get("CNI_ARGS", "")), path=path,
                      config_bytes=stdin)
