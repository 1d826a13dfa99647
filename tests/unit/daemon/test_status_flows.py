"""`netagent flows` (daemon/status_flows.py) against a real status server serving a ring's
/flows page on loopback: the table and JSON, the filters, --follow printing only new flows
(and starting again when the agent restarted), and clear errors for a missing page, a
refused connection and a page that is not flows."""
from __future__ import annotations

import io
import json

import pytest

from netagent.cli import main
from netagent.daemon.status_flows import FlowsError, fetch, show_flows
from netagent.infra.flows import Flow, FlowFilter, FlowRing, Verdict
from netagent.infra.metrics import Registry
from netagent.infra.status_server import HealthReport, StatusServer
from tests.unit.infra.test_flows import drop


def serve(pages) -> StatusServer:
    server = StatusServer(bind="127.0.0.1:0", registry=Registry(), health=lambda: HealthReport(True, "ok"),
                          pages=pages, snapshot_max_age=0.0)
    server.start()
    return server


@pytest.fixture
def agent():
    ring = FlowRing()
    ring.add(drop(1))
    ring.add(drop(2, source_pod="z/c", destination_pod="z/d", pod="z/d", policies=("z/p",)))
    server = serve({"/flows": ("application/json", ring.to_json)})
    try:
        yield ring, f"127.0.0.1:{server.port}"
    finally:
        server.stop()


def test_the_table_and_json_from_a_real_server(agent, capsys):
    ring, address = agent
    assert [f.sequence for f in fetch(address)] == [1, 2]
    assert main(["flows", "--address", address, "--namespace", "z"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "z/c:40002" in lines[1] and "dropped by policy z/p (ingress of z/d)" in lines[1]
    assert main(["flows", "--address", address, "--json", "--verdict", "dropped", "--pod", "x/a"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["policies"] == ["x/deny"]


def test_follow_prints_only_new_flows_and_survives_a_restart():
    pages = [[drop(1)], [drop(1), drop(2)], [drop(1), drop(2)], [drop(9)]]
    numbered = [[Flow(**{**f.__dict__, "sequence": f.source_port - 40000}) for f in page] for page in pages]
    reads = iter(numbered)
    out = io.StringIO()
    show_flows("x", FlowFilter(), as_json=True, follow=True, out=out, read=lambda _: next(reads),
               sleep=lambda _: None, rounds=3)
    assert [json.loads(line)["sequence"] for line in out.getvalue().splitlines()] == [1, 2, 9]


def test_errors_are_clear(agent):
    _, address = agent
    server = serve({})
    try:
        with pytest.raises(FlowsError, match="HTTP 404.*--flows on"):
            fetch(f"127.0.0.1:{server.port}")
    finally:
        server.stop()
    bad = serve({"/flows": ("application/json", lambda: '{"flows": [{"verdict": "sideways"}]}')})
    try:
        with pytest.raises(FlowsError, match="/flows page"):
            fetch(f"127.0.0.1:{bad.port}")
    finally:
        bad.stop()
    with pytest.raises(FlowsError, match="not host:port"):
        fetch("localhost")


def test_the_cli_reports_an_unreachable_agent(capsys):
    server = serve({})
    port = server.port
    server.stop()
    assert main(["flows", "--address", f"127.0.0.1:{port}"]) == 1
    assert "netagent flows: cannot read" in capsys.readouterr().err


def test_a_verdict_outside_the_list_is_a_usage_error():
    with pytest.raises(SystemExit) as exit_:
        main(["flows", "--verdict", "maybe"])
    assert exit_.value.code == 2
    assert Verdict("dropped") is Verdict.DROPPED
