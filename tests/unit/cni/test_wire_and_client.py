"""The client-agent framing, and the thin client against a real unix socket."""
import os
import socket
import threading

import pytest

from cni import client, wire


def test_request_roundtrip():
    env = {"CNI_COMMAND": "ADD", "CNI_ARGS": "A=1;B=2", "HOME": "/root"}
    stdin = b'{"cniVersion": "1.0.0", "x": "\\u00e9"}'
    decoded_env, decoded_stdin = wire.decode_request(wire.encode_request(env, stdin))
    assert decoded_env == {"CNI_COMMAND": "ADD", "CNI_ARGS": "A=1;B=2"}  # only CNI_* travels
    assert decoded_stdin == stdin


@pytest.mark.parametrize("data", [b"", b"garbage\n", b"NACNI1 5 5\nshort", b"NACNI1 x 1\n",
                                  b"NACNI1 99999999 0\n"])
def test_malformed_requests_are_rejected(data):
    with pytest.raises(wire.WireError):
        wire.decode_request(data)


def test_the_plugin_selector_roundtrips_and_is_absent_for_the_main_plugin():
    env, stdin = {"CNI_COMMAND": "DEL"}, b"{}"
    main = wire.encode_request(env, stdin)
    assert main.split(b"\n")[0] == b"NACNI1 15 2"  # what every client before the selector sent
    assert wire.decode_request_for(main) == (env, stdin, wire.PLUGIN_MAIN)
    ipam = wire.encode_request(env, stdin, wire.PLUGIN_IPAM)
    assert ipam.split(b"\n")[0] == b"NACNI1 15 2 netagent-ipam"
    assert wire.decode_request_for(ipam) == (env, stdin, wire.PLUGIN_IPAM)
    assert wire.parse_header(b"NACNI1 15 2 netagent") == (15, 2, wire.PLUGIN_MAIN)
    with pytest.raises(wire.WireError, match="only netagent's"):  # the main plugin's decoder refuses it
        wire.decode_request(ipam)


@pytest.mark.parametrize("header, why", [
    (b"NACNI1 0 0 host-local", "unknown plugin 'host-local'"),
    (b"NACNI1 0 0 NETAGENT-IPAM", "unknown plugin"),
    (b"NACNI1 0 0 netagent-ipam\xff", "unknown plugin"),
    (b"NACNI1 0 0 netagent-ipam extra", "bad request header"),
    (b"NACNI1 0 netagent-ipam", "bad request header"),
    (b"NACNI1 0 0 " + b"x" * 60, "bad request header"),  # past MAX_HEADER
])
def test_malformed_plugin_selectors_are_refused_with_a_reason(header, why):
    with pytest.raises(wire.WireError, match=why):
        wire.parse_header(header)
    with pytest.raises(wire.WireError, match=why):
        wire.decode_request_for(header + b"\n")


def test_reply_roundtrip():
    assert wire.decode_reply(wire.encode_reply(7, '{"code": 7}')) == (7, b'{"code": 7}')
    with pytest.raises(wire.WireError):
        wire.decode_reply(b"0 10\nshort")


def test_read_config_without_json_module():
    assert client.read_config(b'  {"agentSocket": "/run/a.sock", "n": [1, 2.5, true, null]}') == \
        {"agentSocket": "/run/a.sock", "n": [1, 2.5, True, None]}
    assert client.read_config(b"{broken") == {}
    assert client.read_config(b"[1]") == {}


def test_ask_agent_relays_a_reply(tmp_path):
    path = str(tmp_path / "agent.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    seen = {}

    def serve():
        conn, _ = listener.accept()
        data = b""
        while chunk := conn.recv(4096):
            data += chunk
        seen["env"], seen["stdin"] = wire.decode_request(data)
        conn.sendall(wire.encode_reply(0, '{"cniVersion": "1.0.0"}'))
        conn.close()

    thread = threading.Thread(target=serve)
    thread.start()
    reply = client.ask_agent(path, {"CNI_COMMAND": "ADD"}, b"{}")
    thread.join()
    listener.close()
    assert reply == (0, b'{"cniVersion": "1.0.0"}')
    assert seen == {"env": {"CNI_COMMAND": "ADD"}, "stdin": b"{}"}


def test_ask_agent_returns_none_when_nobody_listens(tmp_path):
    assert client.ask_agent(str(tmp_path / "missing.sock"), {}, b"") is None
    stale = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)
    s.close()  # a socket file with no listener: ECONNREFUSED
    assert os.path.exists(stale)
    assert client.ask_agent(stale, {}, b"") is None


def test_agent_that_hangs_times_out(tmp_path):
    path = str(tmp_path / "slow.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    with pytest.raises(OSError):
        client.ask_agent(path, {"CNI_COMMAND": "ADD"}, b"{}", timeout=0.3)
    listener.close()
