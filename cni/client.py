"""The thin CNI client: the binary the container runtime executes for every pod.

It must start in milliseconds, so it imports only built-in C modules (`posix`, `_socket`,
`_json`) on the fast path: no `json` (which pulls in `re`), no `socket` (which pulls in
`enum`), not even `os` (1.8 ms with `_collections_abc` under `python -I -S`), no pyroute2. It reads the config's `agentSocket`, hands the whole request to the node agent
over that root-only unix socket and relays the answer. When no agent listens there, it
runs the very same dispatcher in-process (slower, since netlink support must be imported,
but correct). An agent that accepts but does not answer in time gets code 11, never an
in-process retry that could race with it. What can never succeed is answered here, as the
shim answers it: a socket it may not connect to (the caller is not root) is code 4
"permission denied", and an `agentSocket` over 107 bytes or a request over the wire's
limits 7 or 4, never 11.
"""
import _socket
import posix
import sys

from cni import wire

AGENT_TIMEOUT = 120.0
_NO_AGENT_ERRNOS = (2, 111)  # ENOENT, ECONNREFUSED
_PERMISSION_ERRNOS = (1, 13)  # EPERM, EACCES: the socket is root's; retrying will not help
_PEER_GONE_ERRNOS = (32, 104)  # EPIPE, ECONNRESET: the agent refused early; its reply may be there


class _ScanContext:
    """What `_json.make_scanner` needs: the stdlib decoder's settings, minus `re`."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float
    memo: dict = {}


def read_config(stdin: bytes) -> dict:
    """The config as a dict, or {} when unreadable (the dispatcher will say why)."""
    import _json
    try:
        text = stdin.decode()
        start = len(text) - len(text.lstrip())
        # typeshed types the context as a make_scanner (its own TODO: it is duck-typed)
        config, _ = _json.make_scanner(_ScanContext())(text, start)  # type: ignore[arg-type]
    except Exception:
        return {}
    return config if isinstance(config, dict) else {}


def ask_agent(path: str, env: dict, stdin: bytes, *, timeout: float = AGENT_TIMEOUT):
    """Send the request; return (exit code, stdout bytes), or None when no agent listens.

    An agent that answers before reading everything (a request over its limits) closes
    early: the send fails, and its reply is still read."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            sock.connect(path)
        except OSError as exc:
            if exc.errno in _NO_AGENT_ERRNOS:
                return None
            if exc.errno in _PERMISSION_ERRNOS:
                return _error_reply(stdin, 4, "permission denied: cannot connect to the netagent agent",
                                    f"{path}: {exc.strerror}; the CNI plugin must run as root")
            raise
        sock.settimeout(timeout)
        send_error = None
        try:
            sock.sendall(wire.encode_request(env, stdin))
            sock.shutdown(_socket.SHUT_WR)
        except OSError as exc:
            if exc.errno not in _PEER_GONE_ERRNOS:
                raise
            send_error = exc
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError as exc:
                if send_error is None or exc.errno not in _PEER_GONE_ERRNOS:
                    raise
                chunk = b""
            if not chunk:
                break
            chunks.append(chunk)
        if send_error is not None and not chunks:
            raise send_error
        return wire.decode_reply(b"".join(chunks))
    finally:
        sock.close()


def _error_reply(stdin: bytes, code: int, msg: str, details: str) -> tuple[int, bytes]:
    from cni.dispatch import render_error  # error path only: loads json and logging
    from cni.errors import CniError
    return 1, render_error(stdin, CniError(code, msg, details)).encode()


def run_in_process(env: dict, stdin: bytes) -> tuple[int, bytes]:
    import site
    site.main()  # the binary runs with -I -S; netlink support lives in site-packages
    from cni.dispatch import execute
    handlers = None
    if env.get("CNI_COMMAND") != "VERSION":
        from cni.handlers import PluginHandlers
        handlers = PluginHandlers()
    code, out = execute(env, stdin, handlers)
    return code, out.encode()


def _relay(path: str, env: dict, stdin: bytes):
    """The agent's answer, or the client's own for what the agent could not be asked."""
    problem = wire.socket_path_problem(path)
    if problem:
        return _error_reply(stdin, 7, problem, path)
    too_large = wire.request_too_large(wire.encode_env(env), stdin)
    if too_large is not None:
        return _error_reply(stdin, too_large[0], too_large[1], "")
    try:
        return ask_agent(path, env, stdin)
    except (OSError, wire.WireError) as exc:
        return _error_reply(stdin, 11, "the netagent agent did not answer", f"{path}: {exc}")


def main() -> int:
    stdin = sys.stdin.buffer.read()
    env = {k.decode(errors="surrogateescape"): v.decode(errors="surrogateescape")
           for k, v in posix.environ.items()}
    reply = None
    config = read_config(stdin) if env.get("CNI_COMMAND") not in ("VERSION", None) else {}
    path = config.get("agentSocket")
    if path and isinstance(path, str):
        reply = _relay(path, env, stdin)
    if reply is None:
        reply = run_in_process(env, stdin)
    code, out = reply
    if out:
        sys.stdout.buffer.write(out)
        sys.stdout.buffer.flush()
    return code
