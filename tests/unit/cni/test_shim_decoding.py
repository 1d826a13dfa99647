"""What the real shim binary decides from stdin alone (issue 18): decoding, versions, the default socket.

Built here with its own build script, its default socket pointed at a fake agent of this module
(tests/unit/cni/test_shim_fuzz.py's `FakeAgent`), so "it went to the agent" is observable:
- `{"cniVersion": ""}` is answered for every command under both plugin names (it crashed the
  shim: the empty string left its value NULL while its flag said "present");
- stdin that is not one JSON object (bad UTF-8, nesting past cni/config.py's 512 levels,
  truncated, malformed) is CNI code 6, decided by the shim, never relayed; and the shim says 6
  exactly when the agent's own decoder would (a property over generated documents);
- a config without `agentSocket` (a user's own bridge conflist with `ipam.type: netagent-ipam`)
  reaches the agent at its default socket, and a DEL with no agent there is journaled beside it;
- the shipped build's default is `netagent run`'s `--cni-socket` default, checked in a private
  mount namespace with a tmpfs over /run, so the host's /run/netagent is never touched.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni import version as cni_version
from cni import wire
from cni.config import MAX_JSON_DEPTH, decode_json_object, json_depth
from cni.errors import CniError
from netagent.cniserver import install as cni_install
from tests.shim_support import build_shim_or_skip, run_binary
from tests.unit.cni.test_shim_fuzz import FakeAgent, expected_request

COMMANDS = ("ADD", "CHECK", "DEL", "GC", "STATUS", "VERSION")
ANSWER = (0, b'{"cniVersion": "1.0.0"}')


@pytest.fixture(scope="module")
def sockdir():
    directory = tempfile.mkdtemp(prefix="na-dec-")  # short: a socket path fits in 107 bytes
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def binaries(tmp_path_factory, sockdir) -> dict:
    """{plugin name: path}: one shim whose default socket is `sockdir`/agent.sock."""
    main = build_shim_or_skip(tmp_path_factory.mktemp("shim"), default_socket=os.path.join(sockdir, "agent.sock"))
    ipam = os.path.join(os.path.dirname(main), wire.PLUGIN_IPAM)
    shutil.copy(main, ipam)
    return {wire.PLUGIN_MAIN: main, wire.PLUGIN_IPAM: ipam}


@pytest.fixture
def agent(sockdir):
    """The fake agent on the shim's default socket, answering ANSWER."""
    fake = FakeAgent(os.path.join(sockdir, "agent.sock"))
    fake.reply = ANSWER
    yield fake
    fake.close()


def shim(binary: str, command: str, stdin: bytes) -> tuple[int, bytes]:
    proc = run_binary(binary, {"CNI_COMMAND": command, "NETAGENT_SHIM_TIMEOUT": "60"}, stdin)
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}"
    return proc.returncode, proc.stdout


def decode_error(out: bytes) -> dict:
    error = json.loads(out)
    assert (error["code"], error["msg"]) == (6, "cannot decode the network configuration"), error
    assert error["cniVersion"] == cni_version.LATEST  # as the agent answers what it cannot read
    return error


# ------------------------------------------------------------------ the empty cniVersion
EMPTY_VERSIONS = [b'{"cniVersion": ""}', b'{"cniVersion": "", "agentSocket": ""}',
                  b'{"cniVersion": "", "ipam": {"agentSocket": ""}}', b'{"cniVersion": "1.0.0", "cniVersion": ""}',
                  b'{"cniVersion": "\\u0000"}', b'{"cniVersion": "", "agentSocket": null, "ipam": {}}']


@pytest.mark.parametrize("name", wire.PLUGINS)
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("stdin", EMPTY_VERSIONS)
def test_an_empty_cni_version_is_answered_for_every_command(binaries, agent, name, command, stdin):
    code, out = shim(binaries[name], command, stdin)
    if command == "VERSION":  # answered here, as cni/version.py answers it
        assert (code, out) == (0, json.dumps(cni_version.version_answer("")).encode())
        assert agent.requests == []
    else:  # no socket named: relayed to the default one, the agent judges the version
        assert (code, out) == ANSWER
        assert agent.requests == [expected_request({"CNI_COMMAND": command}, stdin, name)]


# ------------------------------------------------------------------ undecodable stdin is code 6
def nested(depth: int, opener: bytes = b"[") -> bytes:
    """A config whose deepest value sits `depth` levels down (the top-level object is level 1)."""
    if opener == b"[":
        inner = b"[" * (depth - 1) + b"]" * (depth - 1)
    else:
        inner = b'{"a": ' * (depth - 2) + b"{}" + b"}" * (depth - 2)
    return b'{"cniVersion": "1.0.0", "deep": ' + inner + b"}"


UNDECODABLE = {
    "bad UTF-8 in a nested value": b'{"cniVersion": "1.0.0", "x": {"y": ["\xff\xfe"]}}',
    "bad UTF-8 in a key": b'{"cniVersion": "1.0.0", "\xc3": 1}',
    "an overlong encoding": b'{"x": "\xc0\xaf"}',
    "an encoded surrogate": b'{"x": "\xed\xa0\x80"}',
    "a byte-order mark": b'\xef\xbb\xbf{"cniVersion": "1.0.0"}',
    "2,000 nested arrays": nested(2000),
    "2,000 nested arrays, unclosed": b'{"a": ' + b"[" * 2000,
    "2,000 nested objects": nested(2000, b"{"),
    "one level too deep": nested(MAX_JSON_DEPTH + 1),
    "truncated in a string": b'{"cniVersion": "1.0',
    "truncated after a key": b'{"cniVersion"',
    "truncated in a nested array": b'{"cniVersion": "1.0.0", "x": [1, 2',
    "a trailing comma": b'{"cniVersion": "1.0.0",}',
    "a trailing comma in an array": b'{"x": [1,]}',
    "single quotes": b"{'cniVersion': '1.0.0'}",
    "a leading zero": b'{"x": 01}',
    "a bare fraction": b'{"x": .5}',
    "a dangling point": b'{"x": 1.}',
    "a plus sign": b'{"x": +1}',
    "a bare exponent": b'{"x": 1e}',
    "a misspelt literal": b'{"x": tru}',
    "a raw control character": b'{"x": "a\x01b"}',
    "an unknown escape": b'{"x": "\\q"}',
    "a short unicode escape": b'{"x": "\\u12"}',
    "a lone surrogate escape": b'{"x": ["\\udc00"]}',
    "a missing colon": b'{"cniVersion" "1.0.0"}',
    "a number as a key": b'{1: 2}',
    "extra data": b'{"cniVersion": "1.0.0"} {}',
    "an array": b'[{"cniVersion": "1.0.0"}]',
    "a string": b'"x"',
    "nothing but garbage": b"\x00\x01\x02",
}


# Rules the shim states on top of the agent's decoder (cni/shim/json.c's header): stdin is
# UTF-8 without a byte-order mark (json.loads would guess other encodings and pass surrogates),
# and a lone surrogate escape is malformed. Everything else here the agent refuses with 6 too.
SHIM_ONLY_RULES = {"an encoded surrogate", "a byte-order mark", "a lone surrogate escape"}


@pytest.mark.parametrize("name", wire.PLUGINS)
@pytest.mark.parametrize("what", sorted(UNDECODABLE))
def test_stdin_that_is_not_one_json_object_is_code_6_and_never_relayed(binaries, agent, name, what):
    stdin = UNDECODABLE[what]
    code, out = shim(binaries[name], "ADD", stdin)
    assert code == 1
    assert decode_error(out)["details"], "the details say what is wrong and where"
    assert agent.requests == []
    assert agent_cannot_decode(stdin)
    if what not in SHIM_ONLY_RULES:  # the agent's own decoder refuses it with the same code
        with pytest.raises(CniError) as refused:
            decode_json_object(stdin)
        assert refused.value.code == 6


@pytest.mark.parametrize("stdin", [nested(MAX_JSON_DEPTH), nested(MAX_JSON_DEPTH, b"{"),
                                   b'{"x": [NaN, -Infinity, Infinity, -0, 1E+5, 0.5e-3, true, false, null]}',
                                   b' \t\r\n{"x": "\\ud83d\\ude00 \\u00e9 \xc3\xa9 \xf0\x9f\x98\x80 \\/"}\n '],
                         ids=["512 arrays deep", "512 objects deep", "Python's number forms", "escapes and UTF-8"])
def test_what_the_agent_decodes_is_relayed(binaries, agent, stdin):
    decode_json_object(stdin)  # the agent reads these: the shim must not refuse them
    assert shim(binaries[wire.PLUGIN_MAIN], "ADD", stdin) == ANSWER
    assert agent.requests == [expected_request({"CNI_COMMAND": "ADD"}, stdin)]


def agent_cannot_decode(stdin: bytes) -> bool:
    """Whether the agent's decoder (cni/config.py's decode_json_object: the depth bound, then
    json.loads, then "an object") refuses `stdin` read as UTF-8 text, or a lone surrogate escape
    is in it (SHIM_ONLY_RULES)."""
    try:
        text = stdin.decode("utf-8")
        config = None if json_depth(stdin) > MAX_JSON_DEPTH else json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return True
    if not isinstance(config, dict):
        return True
    return any(0xD800 <= ord(c) <= 0xDFFF for c in json.dumps(config, ensure_ascii=False))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12)
documents = st.builds(lambda d, ascii_only: json.dumps(d, ensure_ascii=ascii_only).encode(),
                      st.dictionaries(st.text(max_size=8).filter(lambda k: k != "agentSocket"), json_values,
                                      max_size=4), st.booleans())
mangled = st.one_of(
    documents,
    st.tuples(documents, st.integers(0, 200), st.integers(0, 3), st.binary(max_size=4)).map(  # splice bytes in
        lambda t: t[0][:t[1]] + t[3] + t[0][t[1] + t[2]:]),
    st.tuples(documents, st.integers(1, 700)).map(lambda t: b'{"d": ' + b"[" * t[1] + t[0] + b"]" * t[1] + b"}"),
    st.binary(max_size=64))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(stdin=mangled)
def test_the_shim_answers_6_exactly_when_the_agent_could_not_decode(binaries, agent, stdin):
    agent.requests.clear()
    code, out = shim(binaries[wire.PLUGIN_MAIN], "ADD", stdin)
    if agent_cannot_decode(stdin):
        assert code == 1 and decode_error(out) and agent.requests == []
    else:
        assert (code, out) == ANSWER and agent.requests == [expected_request({"CNI_COMMAND": "ADD"}, stdin)]


# ------------------------------------------------------------------ no agentSocket: the default socket
MAIN_WITHOUT = [{"cniVersion": "1.0.0", "name": "n", "type": "netagent"},
                {"cniVersion": "1.0.0", "name": "n", "type": "netagent", "agentSocket": None},
                {"cniVersion": "1.0.0", "name": "n", "type": "netagent", "agentSocket": ""}]
IPAM_WITHOUT = [{"cniVersion": "1.0.0", "name": "refnet", "type": "bridge", "bridge": "cni0",
                 "ipam": {"type": "netagent-ipam", "ranges": [[{"subnet": "10.250.1.0/24"}]]}},
                {"cniVersion": "0.4.0", "name": "refnet", "type": "bridge", "agentSocket": "/top/level/is/bridge's",
                 "ipam": {"type": "netagent-ipam", "agentSocket": None}},
                {"cniVersion": "1.1.0", "name": "refnet", "type": "ptp", "ipam": {"type": "netagent-ipam",
                                                                                 "agentSocket": ""}}]


@pytest.mark.parametrize("name,config", [(wire.PLUGIN_MAIN, c) for c in MAIN_WITHOUT]
                         + [(wire.PLUGIN_IPAM, c) for c in IPAM_WITHOUT])
@pytest.mark.parametrize("command", ["ADD", "DEL"])
def test_a_config_without_agent_socket_reaches_the_default_socket(binaries, agent, name, config, command):
    stdin = json.dumps(config).encode()
    agent.reply = (3, b'{"code": 3, "msg": "relayed"}')
    assert shim(binaries[name], command, stdin) == agent.reply
    assert agent.requests == [expected_request({"CNI_COMMAND": command}, stdin, name)]


@pytest.mark.parametrize("name", wire.PLUGINS)
def test_with_no_agent_at_the_default_socket_add_is_11_and_del_is_journaled_beside_it(binaries, sockdir, name):
    """No agent: the module's `agent` fixture is not used, so nothing listens on the default socket."""
    stdin = json.dumps(IPAM_WITHOUT[0] if name == wire.PLUGIN_IPAM else MAIN_WITHOUT[0]).encode()
    default = os.path.join(sockdir, "agent.sock")
    code, out = shim(binaries[name], "ADD", stdin)
    error = json.loads(out)
    assert (code, error["code"], error["msg"]) == (1, 11, "the netagent agent is not running")
    assert error["details"].startswith(default + ": connect: ")
    journal = os.path.join(sockdir, "pending-del")
    before = set(os.listdir(journal)) if os.path.isdir(journal) else set()
    assert shim(binaries[name], "DEL", stdin) == (0, b"")
    [record] = set(os.listdir(journal)) - before
    with open(os.path.join(journal, record), "rb") as f:
        assert wire.decode_request_for(f.read()) == ({"CNI_COMMAND": "DEL"}, stdin, name)
    os.unlink(os.path.join(journal, record))


def test_the_shipped_default_socket_is_the_agents(tmp_path, monkeypatch):
    """The build `netagent cni install` copies, run where /run is a tmpfs of a private mount namespace."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare (util-linux) to give the shim a private /run")
    monkeypatch.delenv("NETAGENT_DEFAULT_SOCKET", raising=False)
    if not (os.environ.get("CC") or shutil.which("musl-gcc") or shutil.which("gcc")):
        pytest.skip("no C compiler (musl-gcc or gcc) to build the CNI shim: apt-get install musl-tools")
    binary = cni_install.build_shim(str(tmp_path / "shipped" / "netagent"))
    with open(binary, "rb") as f:
        assert cni_install.DEFAULT_SOCKET.encode() + b"\0" in f.read()
    script = ('mount -t tmpfs tmpfs /run && "$0" <"$1"; echo " rc=$?"; '
              'CNI_COMMAND=DEL "$0" <"$1"; echo " rc=$?"; ls /run/netagent/pending-del')
    config = tmp_path / "conf.json"
    config.write_bytes(json.dumps(MAIN_WITHOUT[0]).encode())
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, binary,
                           str(config)], env={"CNI_COMMAND": "ADD", "PATH": os.environ["PATH"]},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    add, deleted, journal = proc.stdout.split("\n", 2)
    error = json.loads(add.rsplit(" rc=", 1)[0])
    assert error["code"] == 11 and error["details"].startswith(cni_install.DEFAULT_SOCKET + ": connect: ")
    assert deleted == " rc=0" and journal.startswith("shim-") and journal.strip().endswith(".wire")
