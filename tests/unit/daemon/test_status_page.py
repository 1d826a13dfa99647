"""The status page's readers (netagent/daemon/status_page.py) on fakes, and the agent's pages
over real HTTP on 127.0.0.1: /status from the proxies' read-back and the Node watch's names, a
failing reader costing only its section, `/` linking to it, and the page read at most once a
second (a Snapshot) however many times it is fetched."""
from __future__ import annotations

import http.client
import json

import pytest

from netagent.daemon import status_page
from netagent.daemon.status_html import BgpRow, RouteRow, Section
from netagent.daemon.status_page import AgentSources, guarded, services_section
from netagent.infra.fake_clock import FakeClock
from netagent.infra.status_server import HealthReport, StatusServer
from netagent.kernel.iptables.backend import BackendChoice
from proxy.backend import ProgrammedService, ProxyMode

HOSTILE = "ns/<script>alert(1)</script>:http"


class FakeBackend:
    def __init__(self, services: list[ProgrammedService]) -> None:
        self.services = services
        self.reads = 0

    def programmed(self) -> list[ProgrammedService]:
        self.reads += 1
        return self.services


class FakeProxy:
    def __init__(self, *services: ProgrammedService) -> None:
        self.backend = FakeBackend(list(services))


class FakeStore:
    def __init__(self, *nodes: object) -> None:
        self.nodes = list(nodes)

    def list(self) -> list:
        return self.nodes


class FakeReflector:
    def __init__(self, *nodes: object) -> None:
        self.store = FakeStore(*nodes)


class FakeAgent:
    pod_cidrs = ("10.244.1.0/24",)

    def __init__(self, *nodes: object) -> None:
        self.reflector = FakeReflector(*nodes)


def node(name: object, *cidrs: object) -> dict:
    return {"metadata": {"name": name}, "spec": {"podCIDRs": list(cidrs)}}


def sources(**changes) -> AgentSources:
    base = dict(node_name="node-1", routing_mode="vxlan", proxy_mode=ProxyMode.IPTABLES, policy_on=True,
                bgp_state_dir=None, iptables_backend=BackendChoice.AUTO)
    return AgentSources(**{**base, **changes})


@pytest.fixture
def kernel(monkeypatch):
    """The kernel's routes and pods, as the page's readers would find them."""
    seen: dict = {"names": None}

    def routes(names):
        seen["names"] = dict(names)
        return Section(rows=(RouteRow("10.244.2.0/24", "10.244.2.0", "na-vxlan", names.get("10.244.2.0/24", "")),))
    monkeypatch.setattr(status_page, "peer_routes", routes)
    monkeypatch.setattr(status_page, "pods_section", lambda backend: Section())
    return seen


def test_services_section_from_the_listing_sorted():
    section = services_section({"mode": "iptables", "services": [
        {"name": "ns/b:http", "kind": "ClusterIP", "address": "10.96.0.2:80", "backends": []},
        {"name": "ns/a:http", "kind": "NodePort", "address": "192.0.2.1:30080", "backends": ["10.244.1.2:8080"]}]})
    assert [(r.name, r.backends) for r in section.rows] == [("ns/a:http", ("10.244.1.2:8080",)), ("ns/b:http", ())]
    assert services_section({"mode": None, "services": []}).off


def test_a_failing_reader_is_its_sections_error():
    def broken() -> Section:
        raise OSError(2, "No such file or directory")
    assert guarded(broken) == Section(error="FileNotFoundError: [Errno 2] No such file or directory")


def test_the_agents_page_names_peers_from_its_node_watch(kernel):
    page = sources(agent=FakeAgent(node("node-1", "10.244.1.0/24"), node("node-2", "10.244.2.0/24"),
                                   {"metadata": "malformed"}, node(["not", "a", "name"], "10.244.9.0/24"),
                                   node("node-3", 7)),
                   proxies=(FakeProxy(ProgrammedService(HOSTILE, "10.96.0.10:80", "ClusterIP", ("10.244.2.5:80",))),))
    text = page.page()
    assert kernel["names"] == {"10.244.1.0/24": "node-1", "10.244.2.0/24": "node-2"}
    assert "node-2" in text and "10.244.2.0/24" in text and "10.244.1.0/24" in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "<script>" not in text
    assert "10.244.2.5:80" in text and "BGP is off on this node" in text


def test_off_features_are_said_off(kernel):
    text = sources(proxy_mode=None, policy_on=False, agent=FakeAgent()).page()
    assert "the service proxy is off" in text and "network policy is off" in text


def test_a_failing_bgp_read_costs_only_its_section(kernel, monkeypatch):
    def no_bird(state_dir: str) -> Section:
        raise OSError(f"birdc: {state_dir}/bird.ctl: connection refused")
    monkeypatch.setattr(status_page, "bgp_section", no_bird)
    text = sources(bgp_state_dir="/run/x", proxies=(FakeProxy(),), agent=FakeAgent()).page()
    assert "could not read: OSError: birdc: /run/x/bird.ctl: connection refused" in text
    assert "no Service addresses programmed" in text and "10.244.2.0/24" in text


def get(port: int, path: str) -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.getheader("Content-Type") or "", answer.read().decode()
    finally:
        conn.close()


def test_the_metrics_server_serves_status_and_an_index_snapshotted(kernel):
    proxy = FakeProxy(ProgrammedService("default/web:http", "10.96.0.20:80", "ClusterIP", ()))
    page = sources(proxies=(proxy,), agent=FakeAgent())
    clock = FakeClock()
    server = StatusServer(bind="127.0.0.1:0", registry=None, health=lambda: HealthReport(True, "ok"),
                          pages=page.pages(), clock=clock)
    server.start()
    try:
        status, content_type, body = get(server.port, "/status")
        assert status == 200 and content_type == "text/html; charset=utf-8"
        assert "default/web:http" in body and "no endpoints (rejects)" in body
        for _ in range(5):
            assert get(server.port, "/status")[0] == 200
        assert proxy.backend.reads == 1 and server.snapshot("/status").refreshes == 1
        clock.advance(1.5)
        get(server.port, "/status")
        assert proxy.backend.reads == 2
        status, content_type, index = get(server.port, "/")
        assert status == 200 and 'href="/status"' in index
    finally:
        server.stop()


def test_the_command_writes_the_kernels_page(kernel, monkeypatch, tmp_path, capsys):
    from netagent import cli
    from netagent.daemon import status_services
    web = {"name": "default/web:http", "kind": "ClusterIP", "address": "10.96.0.2:80/TCP",
           "backends": ["10.244.1.2:80"]}
    listing = {"mode": "nftables", "source": "kernel", "services": [web]}
    monkeypatch.setattr(status_services, "status_services", lambda **_: json.dumps(listing))
    session = BgpRow("192.0.2.1", "65001", "Established", "now", 3, 1)
    monkeypatch.setattr(status_page, "bgp_section", lambda state_dir: Section(rows=(session,)))
    path = tmp_path / "page.html"
    assert cli.main(["status", "html", "--html", str(path), "--node-name", "node-<1>",
                     "--bgp-state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"wrote {path}\n"
    text = path.read_text()
    assert "netagent on node node-&lt;1&gt;" in text and "read from the kernel" in text
    assert "default/web:http" in text and "10.244.1.2:80" in text and "nftables" in text
    assert "BGP is not running here" in text   # no control socket in the state dir
    (tmp_path / "bird.ctl").touch()
    assert cli.main(["status", "html", "--bgp-state-dir", str(tmp_path)]) == 0
    written = capsys.readouterr().out
    assert written.startswith("<!DOCTYPE html>") and "Established" in written and "192.0.2.1" in written
