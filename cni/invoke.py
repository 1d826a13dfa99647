"""Executing CNI plugin binaries the way a runtime does.

Used wherever netagent plays the runtime's part: delegating IPAM to a plugin found in
`CNI_PATH`, the lab, the tests and the benchmark. Stdlib only. A plugin's error object is
turned back into a `CniError` carrying its code, so callers see one failure type whichever
side of an exec it came from.
"""
from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable

from cni.errors import CniError, ErrorCode

DEFAULT_TIMEOUT = 60.0


def find_plugin(plugin_type: str, search_path) -> str:
    if "/" in plugin_type or plugin_type in ("", ".", ".."):
        raise CniError(ErrorCode.INVALID_CONFIG, f"plugin type {plugin_type!r} is not a plain name")
    for directory in search_path:
        candidate = os.path.join(directory, plugin_type)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise CniError(ErrorCode.INVALID_CONFIG, f"failed to find plugin {plugin_type!r}",
                   f"searched CNI_PATH: {':'.join(search_path) or '(empty)'}")


def cni_environment(*, command: str, container_id: str = "", netns: str = "", ifname: str = "",
                    args: str = "", path=(), base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    for key in [k for k in env if k.startswith("CNI_")]:
        del env[key]
    env["CNI_COMMAND"] = command
    for key, value in (("CNI_CONTAINERID", container_id), ("CNI_NETNS", netns),
                       ("CNI_IFNAME", ifname), ("CNI_ARGS", args), ("CNI_PATH", ":".join(path))):
        if value:
            env[key] = value
    return env


def run_plugin(binary: str, env: dict, stdin: bytes, *, timeout: float = DEFAULT_TIMEOUT,
               prefix: tuple = ()) -> dict | None:
    """Run one plugin; return its decoded stdout (None when it printed nothing).

    `prefix` is prepended to the command line, e.g. `ip netns exec NODE` to run the plugin
    in a node namespace as that node's runtime would.
    """
    try:
        proc = subprocess.run([*prefix, binary], input=stdin, env=env, capture_output=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CniError(ErrorCode.TRY_AGAIN_LATER, f"{os.path.basename(binary)} did not finish "
                       f"within {timeout:.0f} s") from None
    except OSError as exc:
        raise CniError(ErrorCode.IO_FAILURE, f"cannot execute {binary}", str(exc)) from None
    out = proc.stdout.strip()
    decoded = None
    if out:
        try:
            decoded = json.loads(out)
        except ValueError:
            decoded = None
    if proc.returncode != 0:
        if isinstance(decoded, dict) and "code" in decoded:
            raise CniError(int(decoded.get("code") or ErrorCode.DELEGATE_FAILED),
                           str(decoded.get("msg", "")), str(decoded.get("details", "")))
        raise CniError(ErrorCode.DELEGATE_FAILED,
                       f"{os.path.basename(binary)} exited {proc.returncode}",
                       (proc.stderr or proc.stdout).decode(errors="replace").strip()[-2000:])
    if out and decoded is None:
        raise CniError(ErrorCode.DECODE_FAILURE, f"{os.path.basename(binary)} printed no JSON",
                       out.decode(errors="replace")[:2000])
    return decoded


def plugin_config(conflist: dict, index: int, *, prev_result: dict | None = None,
                  runtime_config: dict | None = None) -> bytes:
    """The config a runtime hands plugin `index` of a conflist (libcni's injection rules)."""
    conf = dict(conflist["plugins"][index])
    conf["name"] = conflist["name"]
    conf["cniVersion"] = conflist["cniVersion"]
    if prev_result is not None:
        conf["prevResult"] = prev_result
    capabilities = conf.get("capabilities") or {}
    wanted = {k: v for k, v in (runtime_config or {}).items() if capabilities.get(k)}
    if wanted:
        conf["runtimeConfig"] = wanted
    return json.dumps(conf).encode()


def run_conflist(conflist: dict, *, command: str, bin_dirs, container_id: str, netns: str,
                 ifname: str, args: str = "", prev_result: dict | None = None,
                 runtime_config: dict | None = None, prefix: tuple = ()) -> dict | None:
    """ADD or CHECK through the chain in order, DEL in reverse, as libcni does.

    ADD threads each plugin's result into the next one's `prevResult`; CHECK and DEL hand
    every plugin the cached ADD result (`prev_result`).
    """
    count = len(conflist["plugins"])
    order: Iterable[int] = reversed(range(count)) if command == "DEL" else range(count)
    env = cni_environment(command=command, container_id=container_id, netns=netns,
                          ifname=ifname, args=args, path=tuple(bin_dirs))
    result = prev_result
    for index in order:
        binary = find_plugin(conflist["plugins"][index]["type"], bin_dirs)
        stdin = plugin_config(conflist, index, prev_result=result, runtime_config=runtime_config)
        out = run_plugin(binary, env, stdin, prefix=prefix)
        if command == "ADD":
            result = out
    return result
