"""The one code path from (environment, stdin) to (exit code, stdout).

The node agent runs it for requests arriving on its socket; the thin client runs it
in-process when no agent answers; the standalone IPAM binary runs it with its own handler
table. It validates the request, checks that the config's version allows the operation,
calls a handler and renders the result or the error in the version the config asked for.
Handlers never print and never exit: they return results or raise `CniError`.
"""
from __future__ import annotations

import json
import logging
import traceback
from typing import Protocol

from cni import result as cni_result
from cni import version as cni_version
from cni import wire
from cni.config import (
    ConfigScope,
    NetConf,
    decode_json_object,
    parse_netconf,
    peek_version,
)
from cni.errors import CniError, ErrorCode
from cni.request import CniRequest, request_from_environment

log = logging.getLogger("netagent.cni")

KNOWN_CNI_ARGS = frozenset({"IgnoreUnknown", "K8S_POD_NAMESPACE", "K8S_POD_NAME",
                            "K8S_POD_INFRA_CONTAINER_ID", "K8S_POD_UID", "IP", "MAC"})
VALID_ATTACHMENT_KEYS = ("cni.dev/valid-attachments", "cni.dev/attachments")


class Handlers(Protocol):
    def add(self, conf: NetConf, req: CniRequest) -> dict: ...
    def delete(self, conf: NetConf, req: CniRequest) -> None: ...
    def check(self, conf: NetConf, req: CniRequest) -> None: ...
    def gc(self, conf: NetConf, req: CniRequest, valid: set) -> None: ...
    def status(self, conf: NetConf, req: CniRequest) -> None: ...


def valid_attachments(raw: dict) -> set:
    """GC's still-valid (containerID, ifname) pairs; both spellings of the key are accepted."""
    for key in VALID_ATTACHMENT_KEYS:
        if key in raw:
            entries = raw[key]
            break
    else:
        return set()
    if not isinstance(entries, list):
        raise CniError(ErrorCode.INVALID_CONFIG, f"{key!r} must be a list")
    valid = set()
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("containerID"), str) \
                or not isinstance(entry.get("ifname"), str):
            raise CniError(ErrorCode.INVALID_CONFIG, f"{key!r} entries need string "
                           "'containerID' and 'ifname'", json.dumps(entry)[:200])
        valid.add((entry["containerID"], entry["ifname"]))
    return valid


def _check_args(req: CniRequest) -> None:
    if req.args.get("IgnoreUnknown", "").lower() in ("1", "true"):
        return
    unknown = sorted(set(req.args) - KNOWN_CNI_ARGS)
    if unknown:
        raise CniError(ErrorCode.UNSUPPORTED_FIELD, f"CNI_ARGS has unknown keys: {', '.join(unknown)}",
                       "set IgnoreUnknown=1 to ignore them")


def _run(req: CniRequest, handlers: Handlers | None, scope: ConfigScope) -> str:
    if req.command == "VERSION":
        requested = None
        if req.config_bytes.strip():
            requested = decode_json_object(req.config_bytes).get("cniVersion")
        return json.dumps(cni_version.version_answer(requested))
    if handlers is None:
        raise CniError(ErrorCode.INTERNAL, f"no handlers to run {req.command}")

    conf = parse_netconf(req.config_bytes, scope=scope)
    cni_version.require_operation(req.command, conf.cni_version)
    if req.command in ("ADD", "DEL", "CHECK"):
        _check_args(req)
    if req.command == "ADD":
        own = handlers.add(conf, req)
        try:
            merged = cni_result.merge(conf.prev_result, own) if conf.prev_result else own
            return json.dumps(cni_result.to_version(merged, conf.cni_version))
        except Exception:  # prevResult is validated up front; should rendering still fail, undo
            _undo_add(handlers, conf, req)
            raise
    if req.command == "DEL":
        handlers.delete(conf, req)
    elif req.command == "CHECK":
        if conf.prev_result is None:
            raise CniError(ErrorCode.INVALID_CONFIG, "CHECK needs 'prevResult'")
        handlers.check(conf, req)
    elif req.command == "GC":
        handlers.gc(conf, req, valid_attachments(conf.raw))
    elif req.command == "STATUS":
        handlers.status(conf, req)
    return ""


def _undo_add(handlers: Handlers, conf: NetConf, req: CniRequest) -> None:
    try:
        handlers.delete(conf, req)
    except Exception:
        log.exception("could not undo an ADD whose result could not be rendered")


def _check_sizes(environ, stdin: bytes) -> None:
    """The wire's limits, on every path: what the agent cannot be sent is refused in-process too."""
    too_large = wire.request_too_large(wire.encode_env(environ), stdin)
    if too_large is not None:
        raise CniError(*too_large)


def render_error(stdin: bytes, error: CniError) -> str:
    """The spec's error object, in the version the config on stdin asked for when readable.

    Only failures pay for reading the version: the success path decodes the config once.
    """
    try:
        config = decode_json_object(stdin) if stdin.strip() and len(stdin) <= wire.MAX_STDIN else {}
    except CniError:
        config = {}
    return json.dumps(error.to_dict(peek_version(config)))


def execute(environ, stdin: bytes, handlers: Handlers | None, *,
            scope: ConfigScope = ConfigScope.PLUGIN) -> tuple[int, str]:
    """Run one CNI request; return (exit code, stdout text). Never raises.

    `handlers` may be None for VERSION, which needs none (the thin client then imports nothing
    that touches the kernel)."""
    try:
        _check_sizes(environ, stdin)
        req = request_from_environment(environ, stdin)
        return 0, _run(req, handlers, scope)
    except CniError as err:
        log.info("CNI %s failed: %s", environ.get("CNI_COMMAND", "?"), err)
        return 1, render_error(stdin, err)
    except Exception as exc:  # a bug or an unexpected kernel answer: still a spec error
        log.error("CNI %s crashed:\n%s", environ.get("CNI_COMMAND", "?"), traceback.format_exc())
        crash = CniError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}", str(exc))
        return 1, render_error(stdin, crash)
