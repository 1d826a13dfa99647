"""The framing between the thin CNI client and the node agent's socket.

Deliberately not JSON: the client must not pay for importing `json` (it pulls in `re`,
about 10 ms at start-up); and no `from __future__` import either (0.2 ms). A request is a header line `NACNI1 <env bytes> <stdin bytes>`,
then the `CNI_*` variables as NUL-separated `KEY=VALUE`, then stdin verbatim. A reply
is `<exit code> <stdout bytes>` and the plugin's stdout verbatim.
"""
MAGIC = b"NACNI1"
MAX_HEADER = 64
MAX_ENV = 64 * 1024
MAX_STDIN = 16 * 1024 * 1024
MAX_SOCKET_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1, as the shim checks it


class WireError(Exception):
    pass


def encode_env(env) -> bytes:
    """The CNI_* variables as the wire carries them. Values that came from non-UTF-8 bytes
    (surrogate-escaped, as the client decodes the environment) travel as those bytes, as the
    shim relays them: the agent then refuses them with code 4, like the in-process path."""
    return b"\0".join(f"{k}={v}".encode("utf-8", "surrogateescape")
                      for k, v in env.items() if k.startswith("CNI_"))


def request_too_large(env_blob: bytes, stdin: bytes) -> "tuple[int, str] | None":
    """(CNI code, message) when a request exceeds the wire's limits, as the shim words it."""
    return lengths_too_large(len(env_blob), len(stdin))


def lengths_too_large(env_len: int, stdin_len: int) -> "tuple[int, str] | None":
    if stdin_len > MAX_STDIN:
        return 7, "the network configuration is larger than 16 MiB"
    if env_len > MAX_ENV:
        return 4, "the CNI_* environment is larger than 64 KiB"
    return None


def socket_path_problem(path: str) -> "str | None":
    """Why `path` cannot be the agent's socket (the config parser and both clients agree)."""
    if not path.startswith("/") or "\0" in path \
            or len(path.encode("utf-8", "surrogateescape")) > MAX_SOCKET_PATH:
        return "'agentSocket' must be an absolute path of at most %d bytes" % MAX_SOCKET_PATH
    return None


def encode_request(env: dict, stdin: bytes) -> bytes:
    blob = encode_env(env)
    return b"%s %d %d\n" % (MAGIC, len(blob), len(stdin)) + blob + stdin


def header_lengths(header: bytes) -> "tuple[int, int] | None":
    """(env bytes, stdin bytes) a request header line announces, or None if it is malformed.
    Limits are not applied here: `request_too_large` says which one a request exceeds."""
    parts = header.split()
    if len(parts) != 3 or parts[0] != MAGIC or not parts[1].isdigit() or not parts[2].isdigit() \
            or len(header) > MAX_HEADER:
        return None
    return int(parts[1]), int(parts[2])


def _request_lengths(header: bytes) -> "tuple[int, int] | None":
    lengths = header_lengths(header)
    if lengths is None or lengths[0] > MAX_ENV or lengths[1] > MAX_STDIN:
        return None
    return lengths


def decode_request(data: bytes) -> tuple[dict, bytes]:
    header, sep, rest = data.partition(b"\n")
    lengths = _request_lengths(header) if sep else None
    if lengths is None:
        raise WireError("malformed request header")
    env_len, stdin_len = lengths
    if len(rest) != env_len + stdin_len:
        raise WireError("request length does not match its header")
    env = {}
    for item in rest[:env_len].split(b"\0"):
        key, eq, value = item.decode().partition("=")
        if eq and key.startswith("CNI_"):
            env[key] = value
    return env, rest[env_len:]


def encode_reply(code: int, stdout: str) -> bytes:
    body = stdout.encode()
    return b"%d %d\n" % (code, len(body)) + body


def decode_reply(data: bytes) -> tuple[int, bytes]:
    header, sep, body = data.partition(b"\n")
    parts = header.split()
    if not sep or len(parts) != 2 or not parts[1].isdigit() or len(body) != int(parts[1]):
        raise WireError("malformed reply")
    return int(parts[0]), body
