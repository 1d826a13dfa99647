"""The framing between the thin CNI client and the node agent's socket.

Deliberately not JSON: the client must not pay for importing `json` (it pulls in `re`,
about 10 ms at start-up); and no `from __future__` import either (0.2 ms). A request is a header line `NACNI1 <env bytes> <stdin bytes> [<plugin>]`,
then the `CNI_*` variables as NUL-separated `KEY=VALUE`, then stdin verbatim. A reply
is `<exit code> <stdout bytes>` and the plugin's stdout verbatim.

`<plugin>` is the name the shim was executed as (argv[0]'s basename): absent for the main
plugin `netagent` (what every client before it sent, and the shim's DEL journal holds),
`netagent-ipam` for an IPAM-only request a reference main plugin (bridge, ptp, ...) made.
Any other word is a malformed request: the agent refuses it, never guesses.
"""
from netagent.errors import NetagentError  # imports nothing: costs the client nothing

MAGIC = b"NACNI1"
PLUGIN_MAIN = "netagent"
PLUGIN_IPAM = "netagent-ipam"
PLUGINS = (PLUGIN_MAIN, PLUGIN_IPAM)
MAX_HEADER = 64
MAX_ENV = 64 * 1024
MAX_STDIN = 16 * 1024 * 1024
MAX_SOCKET_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1, as the shim checks it


class WireError(NetagentError):
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


def encode_request(env: dict, stdin: bytes, plugin: str = PLUGIN_MAIN) -> bytes:
    blob = encode_env(env)
    selector = b"" if plugin == PLUGIN_MAIN else b" " + plugin.encode()
    return b"%s %d %d%s\n" % (MAGIC, len(blob), len(stdin), selector) + blob + stdin


def parse_header(header: bytes) -> "tuple[int, int, str]":
    """(env bytes, stdin bytes, plugin) a request header line announces; WireError saying
    what is wrong if it is malformed. Limits are not applied here: `request_too_large` says
    which one a request exceeds."""
    parts = header.split()
    if len(header) > MAX_HEADER or len(parts) not in (3, 4) or parts[0] != MAGIC \
            or not parts[1].isdigit() or not parts[2].isdigit():
        raise WireError("bad request header")
    plugin = parts[3].decode("ascii", "replace") if len(parts) == 4 else PLUGIN_MAIN
    if plugin not in PLUGINS:
        raise WireError("the request names an unknown plugin %r (this agent serves %s)"
                        % (plugin[:32], ", ".join(PLUGINS)))
    return int(parts[1]), int(parts[2]), plugin


def decode_request(data: bytes) -> tuple[dict, bytes]:
    """The main plugin's request (env, stdin); WireError for any other plugin's."""
    env, stdin, plugin = decode_request_for(data)
    if plugin != PLUGIN_MAIN:
        raise WireError("a %s request where only %s's are accepted" % (plugin, PLUGIN_MAIN))
    return env, stdin


def decode_request_for(data: bytes) -> "tuple[dict, bytes, str]":
    """(env, stdin, plugin) of a whole request, checked against its header and the limits."""
    header, sep, rest = data.partition(b"\n")
    if not sep:
        raise WireError("malformed request header")
    env_len, stdin_len, plugin = parse_header(header)
    if lengths_too_large(env_len, stdin_len) is not None:
        raise WireError("malformed request header")
    if len(rest) != env_len + stdin_len:
        raise WireError("request length does not match its header")
    return decode_env(rest[:env_len]), rest[env_len:], plugin


def decode_env(blob: bytes) -> dict:
    """The CNI_* variables of a request's environment part; UnicodeDecodeError if not UTF-8."""
    env = {}
    for item in blob.split(b"\0"):
        key, eq, value = item.decode().partition("=")
        if eq and key.startswith("CNI_"):
            env[key] = value
    return env


def encode_reply(code: int, stdout: str) -> bytes:
    body = stdout.encode()
    return b"%d %d\n" % (code, len(body)) + body


def decode_reply(data: bytes) -> tuple[int, bytes]:
    header, sep, body = data.partition(b"\n")
    parts = header.split()
    if not sep or len(parts) != 2 or not parts[1].isdigit() or len(body) != int(parts[1]):
        raise WireError("malformed reply")
    return int(parts[0]), body
