"""The CNI shim (cni/shim/) fuzzed, against a fake agent that answers or misbehaves.

The shim is built into a temporary directory with its own build script. Whatever it is
given (random, oversized, truncated or binary stdin; random, binary or missing variables)
and however the agent behaves (answers, closes early, sends garbage or too much, never
answers), it must exit with a status, never a signal; print valid JSON whenever it
reports an error; and finish within its timeout (NETAGENT_SHIM_TIMEOUT, set short here).
Where the agent answers, the request it received is byte for byte what cni/wire.py frames.
The same holds for the shim copied as `netagent-ipam` (argv[0] selects the IPAM-only
plugin: the socket comes from the config's `ipam` section, the header carries the selector).
Configs carry any cniVersion, "" included. The coverage-guided fuzzer of the same parsing is
cni/shim/fuzz/ (tests/unit/cni/test_shim_libfuzzer.py).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni import version as cni_version
from cni import wire
from tests.shim_support import build_shim_or_skip, run_binary

TIMEOUT = "0.3"  # NETAGENT_SHIM_TIMEOUT for runs that may not be answered: a hang shows up as a test timeout
ANSWERED = "60"  # ... and for runs the fake agent must answer: its thread may be slow on a loaded CI
# the `agent` fixture is one per test and shared by its examples on purpose (each example resets it)
FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


class FakeAgent:
    """A unix socket server that reads a request and then behaves as `mode` says."""

    MISBEHAVIOURS = ("close", "garbage", "oversized", "short", "bad-code", "no-newline")

    def __init__(self, path: str) -> None:
        self.path = path
        self.mode = "echo"
        self.reply = (0, b'{"cniVersion": "1.0.0"}')
        self.requests: list[bytes] = []
        self._held: list[socket.socket] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(64)
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        for conn in self._held:
            conn.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn, self.mode), daemon=True).start()

    def _handle(self, conn: socket.socket, mode: str) -> None:
        with contextlib.suppress(OSError):
            if mode == "close":
                conn.close()
                return
            conn.settimeout(10)
            data = b""
            while chunk := conn.recv(1 << 20):
                data += chunk
            self.requests.append(data)
            if mode == "silent":
                self._held.append(conn)  # never answers, never closes
                return
            if mode == "trickle":
                while True:
                    conn.sendall(b"0")
                    time.sleep(0.05)
            code, body = self.reply
            conn.sendall({"echo": b"%d %d\n" % (code, len(body)) + body,
                          "garbage": b"\x00\xff\xfegarbage\n\x01",
                          "short": b"0 100\n{}",
                          "bad-code": b"300 2\n{}",
                          "no-newline": b"0" * 200}.get(mode, b""))
            if mode == "oversized":  # announce and send more than the shim accepts
                conn.sendall(b"0 %d\n" % (17 << 20))
                chunk = b"x" * (1 << 20)
                for _ in range(17):
                    conn.sendall(chunk)
            conn.close()


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> str:
    return build_shim_or_skip(tmp_path_factory.mktemp("shim"))


@pytest.fixture(scope="module")
def binaries(shim) -> dict:
    """{plugin name: path}: the one shim under both names `netagent cni install` gives it."""
    ipam = os.path.join(os.path.dirname(shim), wire.PLUGIN_IPAM)
    shutil.copy(shim, ipam)
    return {wire.PLUGIN_MAIN: shim, wire.PLUGIN_IPAM: ipam}


@pytest.fixture(scope="module")
def sockdir():
    """A short directory of our own: unix socket paths must stay under 108 bytes."""
    directory = tempfile.mkdtemp(prefix="na-shim-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def agent(sockdir):
    """A fresh agent per test, on its own socket: a connection a timed-out shim left in the last
    test's backlog (its accept thread was slow) is never accepted and recorded here."""
    directory = tempfile.mkdtemp(prefix="a", dir=sockdir)
    fake = FakeAgent(os.path.join(directory, "agent.sock"))
    yield fake
    fake.close()


def run(shim: str, env: dict, stdin: bytes, *, shim_timeout: str = TIMEOUT, **kwargs) -> subprocess.CompletedProcess:
    env = {b"NETAGENT_SHIM_TIMEOUT": shim_timeout.encode(), **{_b(k): _b(v) for k, v in env.items()}}
    proc = run_binary(shim, env, stdin, timeout=float(shim_timeout) + 30, **kwargs)
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}"
    if proc.returncode != 0:
        error = json.loads(proc.stdout)
        assert isinstance(error["code"], int) and isinstance(error["msg"], str), error
    return proc


def _b(value) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def config(socket_path, **extra) -> bytes:
    return json.dumps({"cniVersion": "1.0.0", "name": "n", "type": "netagent",
                       "agentSocket": socket_path, **extra}).encode()


def ipam_config(socket_path, **extra) -> bytes:
    """What a main plugin (bridge) hands netagent-ipam: the socket in its `ipam` section."""
    return json.dumps({"cniVersion": "1.0.0", "name": "n", "type": "bridge", **extra,
                       "ipam": {"type": wire.PLUGIN_IPAM, "agentSocket": socket_path}}).encode()


def expected_request(env: dict, stdin: bytes, plugin: str = wire.PLUGIN_MAIN) -> bytes:
    """cni/wire.py's encode_request, on the raw bytes a process environment holds."""
    items = [_b(k) + b"=" + _b(v) for k, v in env.items() if _b(k).startswith(b"CNI_")]
    blob = b"\0".join(items)
    selector = b"" if plugin == wire.PLUGIN_MAIN else b" " + plugin.encode()
    return b"%s %d %d%s\n" % (wire.MAGIC, len(blob), len(stdin), selector) + blob + stdin


# ------------------------------------------------------------------ strategies
env_keys = st.one_of(st.sampled_from(["CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS",
                                      "CNI_PATH", "PATH", "HOME"]),
                     st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", min_size=1, max_size=12).map(lambda s: "CNI_" + s))
env_values = st.one_of(st.sampled_from(["ADD", "DEL", "CHECK", "GC", "STATUS", "eth0", "/var/run/netns/x", ""]),
                       st.binary(max_size=300).map(lambda b: b.replace(b"\0", b"")))
environments = st.dictionaries(env_keys, env_values, max_size=10)
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                           max_leaves=20)


def configs(agent_path: str, down_path: str):
    socket_values = st.one_of(st.just(agent_path), st.just(down_path), st.just("relative.sock"),
                              st.just("/" + "x" * 200), json_values)
    sections = st.one_of(st.none(), json_values, st.builds(  # an "ipam" section, netagent-ipam's socket
        lambda sock, extra: {**extra, "agentSocket": sock}, socket_values,
        st.dictionaries(st.text(max_size=12), json_values, max_size=3)))
    versions = st.one_of(st.none(), st.just(""), st.sampled_from(cni_version.SUPPORTED_VERSIONS), st.text(max_size=6),
                         json_values)  # "" crashed the shim once (issue 18)
    documents = st.builds(lambda version, sock, extra, drop, ipam: json.dumps(
        {**({} if version is None else {"cniVersion": version}), **({} if drop else {"agentSocket": sock}), **extra,
         **({} if ipam is None else {"ipam": ipam})}).encode(),
        versions, socket_values, st.dictionaries(st.text(max_size=12), json_values, max_size=5), st.booleans(),
        sections)
    mangled = st.tuples(documents, st.integers(0, 400), st.binary(max_size=8)).map(
        lambda t: t[0][:t[1]] + t[2])  # truncated, with junk after
    return st.one_of(documents, mangled, st.binary(max_size=2000),
                     st.integers(1, 20000).map(lambda n: b'{"a": ' + b"[" * n))


# ------------------------------------------------------------------ properties
@pytest.mark.parametrize("name", wire.PLUGINS)
@FUZZ
@given(env=environments, extra=st.dictionaries(st.text(max_size=10), json_values, max_size=5),
       code=st.integers(0, 255), body=st.binary(max_size=500))
def test_the_agent_receives_what_wire_py_frames_and_its_answer_is_relayed(binaries, agent, name, env, extra, code,
                                                                         body):
    """As netagent-ipam the socket is the `ipam` section's and the header carries the selector."""
    env = {k: v for k, v in env.items() if k != "CNI_COMMAND"}
    env["CNI_COMMAND"] = "ADD"
    if name == wire.PLUGIN_IPAM:
        stdin = ipam_config(agent.path, **{k: v for k, v in extra.items() if k != "ipam"})
    else:
        stdin = json.dumps({**extra, "agentSocket": agent.path}).encode()
    agent.requests.clear()
    agent.reply = (code, body)
    proc = run_binary(binaries[name], {_b(k): _b(v) for k, v in env.items()}, stdin, timeout=60)
    assert agent.requests == [expected_request(env, stdin, name)]
    assert wire.parse_header(agent.requests[0].split(b"\n", 1)[0])[2] == name
    assert (proc.returncode, proc.stdout) == (code, body)


@pytest.mark.parametrize("name", wire.PLUGINS)
@FUZZ
@given(data=st.data(), env=environments, mode=st.sampled_from(("echo",) + FakeAgent.MISBEHAVIOURS))
def test_never_crashes_and_always_says_why_in_json(binaries, agent, sockdir, name, data, env, mode):
    stdin = data.draw(configs(agent.path, os.path.join(sockdir, "down", "agent.sock")))
    agent.mode = mode
    proc = run(binaries[name], env, stdin)
    if proc.stdout:
        json.loads(proc.stdout)
    if mode != "echo" and proc.returncode != 0 and env.get("CNI_COMMAND") != "VERSION":
        assert json.loads(proc.stdout)["code"] in (4, 6, 7, 11)


@pytest.mark.parametrize("mode", FakeAgent.MISBEHAVIOURS + ("silent", "trickle"))
def test_a_misbehaving_agent_is_code_11(shim, agent, mode):
    agent.mode = mode
    started = time.monotonic()
    proc = run(shim, {"CNI_COMMAND": "ADD"}, config(agent.path))
    assert time.monotonic() - started < 10  # its 0.3 s, not the default 120 s; generous for a loaded CI
    error = json.loads(proc.stdout)
    assert (proc.returncode, error["code"], error["msg"]) == (1, 11, "the netagent agent did not answer")
    assert error["details"].startswith(agent.path + ": ")


@pytest.mark.parametrize("requested", [None, "0.3.0", "0.4.0", "1.0.0", "1.1.0", "9.9.9", 1, ["1.0.0"]])
def test_version_is_answered_locally_like_cni_version(shim, requested):
    stdin = b"" if requested is None else json.dumps({"cniVersion": requested, "agentSocket": "/nowhere"}).encode()
    proc = run(shim, {"CNI_COMMAND": "VERSION"}, stdin)
    assert proc.returncode == 0
    assert proc.stdout == json.dumps(cni_version.version_answer(requested)).encode()


def test_oversized_stdin_and_environment_are_refused(shim, agent):
    at_limit = config(agent.path, pad="")
    at_limit = at_limit[:-1] + b' ' * (wire.MAX_STDIN - len(at_limit)) + b"}"
    assert len(at_limit) == wire.MAX_STDIN
    proc = run(shim, {"CNI_COMMAND": "ADD"}, at_limit, shim_timeout=ANSWERED)
    assert proc.returncode == 0 and agent.requests == [expected_request({"CNI_COMMAND": "ADD"}, at_limit)]
    proc = run(shim, {"CNI_COMMAND": "ADD"}, at_limit + b" ")
    assert json.loads(proc.stdout)["code"] == 7

    big_env = {"CNI_COMMAND": "ADD", "CNI_ARGS": "x" * (wire.MAX_ENV - len("CNI_COMMAND=ADD\0CNI_ARGS="))}
    assert len(expected_request(big_env, b"").split(b"\n", 1)[1]) == wire.MAX_ENV
    assert run(shim, big_env, config(agent.path), shim_timeout=ANSWERED).returncode == 0
    proc = run(shim, {**big_env, "CNI_ARGS": big_env["CNI_ARGS"] + "x"}, config(agent.path))
    assert json.loads(proc.stdout)["code"] == 4


@pytest.mark.parametrize("how", ["missing", "stale"])
def test_no_agent_is_code_11_and_a_del_is_journaled(shim, tmp_path, how):
    path = str(tmp_path / "run" / "agent.sock")
    if how == "stale":  # a socket file nobody listens on: ECONNREFUSED
        os.mkdir(tmp_path / "run")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(path)
    proc = run(shim, {"CNI_COMMAND": "ADD"}, config(path))
    error = json.loads(proc.stdout)
    assert (proc.returncode, error["code"], error["msg"]) == (1, 11, "the netagent agent is not running")

    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0"}
    proc = run(shim, env, config(path))
    assert (proc.returncode, proc.stdout) == (0, b"")
    journal = tmp_path / "run" / "pending-del"
    records = sorted(journal.iterdir())
    assert [r.suffix for r in records] == [".wire"]
    assert records[0].read_bytes() == expected_request(env, config(path))
    assert wire.decode_request(records[0].read_bytes()) == (env, config(path))


def test_as_netagent_ipam_a_del_without_agent_is_journaled_with_its_selector(binaries, tmp_path):
    path = str(tmp_path / "run" / "agent.sock")
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0"}
    proc = run(binaries[wire.PLUGIN_IPAM], env, ipam_config(path, agentSocket="/top/level/is/bridge's"))
    assert (proc.returncode, proc.stdout) == (0, b"")
    [record] = sorted((tmp_path / "run" / "pending-del").iterdir())
    stdin = ipam_config(path, agentSocket="/top/level/is/bridge's")
    assert record.read_bytes() == expected_request(env, stdin, wire.PLUGIN_IPAM)
    assert wire.decode_request_for(record.read_bytes()) == (env, stdin, wire.PLUGIN_IPAM)


@pytest.mark.parametrize("stdin,code,msg", [
    # no ipam.agentSocket: the default socket (this build's: nothing listens there), never a top-level one
    (b'{"agentSocket": "/a.sock"}', 11, "not running"),  # the top level is the main plugin's
    (b'{"ipam": {"agentSocket": "/a.sock"}, "ipam": null}', 11, "not running"),  # the last wins
    (b'{"ipam": {"x": {"agentSocket": "/a.sock"}}}', 11, "not running"),  # only the section's own key
    (b'{"ipam": [{"agentSocket": "/a.sock"}]}', 11, "not running"),
    (b'{"ipam": {"agentSocket": 5}}', 7, "'ipam.agentSocket' must be a string"),
    (b'{"ipam": {"agentSocket": "a/b"}}', 7, "'ipam.agentSocket' must be an absolute path"),
    (b'{"ipam": {"agentSocket": "/a.sock"}', 6, "cannot decode"),
    (b'{"ipam": {"agentSocket": "\\udc00"}}', 6, "cannot decode")])
def test_as_netagent_ipam_bad_sections_are_reported_in_json(binaries, stdin, code, msg):
    proc = run(binaries[wire.PLUGIN_IPAM], {"CNI_COMMAND": "ADD"}, stdin)
    error = json.loads(proc.stdout)
    assert (proc.returncode, error["code"]) == (1, code) and msg in error["msg"], error
    if code == 11:
        assert error["details"].startswith(default_socket(binaries[wire.PLUGIN_MAIN]) + ": connect: ")


def default_socket(shim: str) -> str:
    """Where a config without agentSocket sends this module's shim (tests/shim_support.py's default)."""
    return os.path.join(os.path.dirname(shim), "no-agent", "cni.sock")


def test_a_del_that_cannot_be_journaled_is_code_11(shim, tmp_path):
    path = str(tmp_path / "no" / "such" / "agent.sock")  # two missing levels: not created
    proc = run(shim, {"CNI_COMMAND": "DEL"}, config(path))
    assert json.loads(proc.stdout)["code"] == 11 and "cannot journal" in json.loads(proc.stdout)["details"]


@pytest.mark.parametrize("stdin,code", [(b"", 6), (b"[1]", 6), (b'{"agentSocket": 5}', 7),
                                        (b'{"agentSocket": "a/b"}', 7), (b'{"agentSocket": "/a\\u0000b"}', 7),
                                        (b'{"agentSocket": "/a"} x', 6), (b'{"agentSocket": "\\ud800"}', 6),
                                        (b'{"x": "\xff\xfe", "agentSocket": "/\xff"}', 6),  # not UTF-8: issue 18
                                        (b'{"agentSocket": "/\xc3\xa9"}', 11)])
def test_bad_configs_are_reported_in_json(shim, stdin, code):
    proc = run(shim, {"CNI_COMMAND": "ADD"}, stdin)
    assert proc.returncode == 1 and json.loads(proc.stdout)["code"] == code


def test_a_closed_stdout_or_stdin_is_an_exit_code_not_a_signal(shim, agent):
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([shim], input=b"{}", stdout=write_end, env={"CNI_COMMAND": "VERSION"}, timeout=10)
    finally:
        os.close(write_end)
    assert proc.returncode >= 0
    proc = subprocess.run([shim], stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
                          env={"CNI_COMMAND": "ADD"}, preexec_fn=lambda: os.close(0))
    assert proc.returncode == 1 and json.loads(proc.stdout)["code"] == 5


@pytest.mark.parametrize("value", ["abc", "-1", "0", "1e9", "", "nan"])
def test_a_nonsense_timeout_knob_is_ignored(shim, agent, value):
    proc = run_binary(shim, {"CNI_COMMAND": "ADD", "NETAGENT_SHIM_TIMEOUT": value}, config(agent.path))
    assert proc.returncode == 0 and proc.stdout == agent.reply[1]
