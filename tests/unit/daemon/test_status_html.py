"""The status page's renderer (netagent/daemon/status_html.py) on hostile, huge and empty
values: every string escaped (a Service or pod named with markup stays text), tables and cells
capped with "N more", each empty, off and failed section said in words, and nothing on the
page that loads or runs anything."""
from __future__ import annotations

from html.parser import HTMLParser

from netagent.daemon.status_html import (MAX_ITEMS, MAX_ROWS, MAX_TEXT, BgpRow, PodRow, PolicyRow, RouteRow,
                                         Section, ServiceRow, StatusPage, render_index, render_page)

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>&amp;\'"'


class Parsed(HTMLParser):
    """The page as a browser's tokenizer sees it: its tags, their attributes, its text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str | None]] = []
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes.extend(attrs)

    def handle_data(self, data):
        self.text.append(data)

    def all_text(self) -> str:
        return "".join(self.text)


def page(**sections) -> StatusPage:
    return StatusPage(node=sections.pop("node", "node-1"), source="a test", generated="now", **sections)


def hostile_page() -> str:
    return render_page(StatusPage(
        node=HOSTILE, source=HOSTILE, generated=HOSTILE, facts=((HOSTILE, HOSTILE),),
        peers=Section(rows=(RouteRow(HOSTILE, HOSTILE, HOSTILE, HOSTILE),)),
        services=Section(rows=(ServiceRow(HOSTILE, HOSTILE, HOSTILE, (HOSTILE,)),)),
        pods=Section(rows=(PodRow(HOSTILE, HOSTILE, (PolicyRow("ingress", (HOSTILE,), (HOSTILE,), 3),)),)),
        bgp=Section(rows=(BgpRow(HOSTILE, HOSTILE, HOSTILE, HOSTILE, 1, 2, HOSTILE),))))


def test_every_string_is_escaped_and_stays_text():
    text = hostile_page()
    parsed = Parsed(text)
    assert "script" not in parsed.tags and "img" not in parsed.tags
    assert not any(name.startswith("on") for name, _ in parsed.attributes)
    assert "<script>" not in text and "<img" not in text
    # the name is shown as the user wrote it: once in each of the sections plus the header's
    assert parsed.all_text().count(HOSTILE) >= 10


def test_an_error_and_an_off_reason_are_escaped_too():
    parsed = Parsed(render_page(page(peers=Section(error=HOSTILE), bgp=Section(off=HOSTILE))))
    assert "script" not in parsed.tags
    assert f"could not read: {HOSTILE}" in parsed.all_text() and HOSTILE in parsed.all_text()


def test_the_page_loads_and_runs_nothing():
    for text in (hostile_page(), render_index()):
        parsed = Parsed(text)
        assert {"script", "img", "link", "iframe", "object", "embed", "form"}.isdisjoint(parsed.tags)
        assert "http://" not in text and "https://" not in text and "url(" not in text
        assert 'http-equiv="Content-Security-Policy"' in text and "default-src 'none'" in text
        assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")


def test_tables_are_capped_with_the_rest_counted():
    services = tuple(ServiceRow(f"ns/svc-{i:04d}:http", "ClusterIP", f"10.96.{i // 256}.{i % 256}:80")
                     for i in range(MAX_ROWS + 57))
    text = render_page(page(services=Section(rows=services)))
    assert "svc-0000" in text and f"svc-{MAX_ROWS - 1:04d}" in text and f"svc-{MAX_ROWS:04d}" not in text
    assert "57 more addresses" in text
    assert Parsed(text).tags.count("tr") == 1 + MAX_ROWS + 1   # the header, the rows, the "more" row


def test_a_cell_lists_at_most_max_items():
    backends = tuple(f"10.244.1.{i}:8080" for i in range(MAX_ITEMS + 5))
    allows = tuple(f"rule {i}" for i in range(MAX_ITEMS + 1))
    text = render_page(page(services=Section(rows=(ServiceRow("ns/web:http", "ClusterIP", "10.96.0.10:80", backends),)),
                            pods=Section(rows=(PodRow("ns/web-0", "10.244.1.2",
                                                      (PolicyRow("ingress", ("ns/deny",), allows, 0),)),))))
    assert f"10.244.1.{MAX_ITEMS - 1}:8080" in text and f"10.244.1.{MAX_ITEMS}:8080" not in text
    assert "5 more endpoints" in text and "1 more allow rules" in text


def test_a_long_string_is_cut():
    long = "n" * (MAX_TEXT * 3)
    text = render_page(page(services=Section(rows=(ServiceRow(long, "ClusterIP", "10.96.0.1:443"),))))
    assert "n" * MAX_TEXT + "\u2026" in text and "n" * (MAX_TEXT + 1) not in text


def test_empty_off_and_failed_sections_say_so():
    text = Parsed(render_page(page(services=Section(off="the service proxy is off"),
                                   bgp=Section(error="birdc: no such socket")))).all_text()
    assert "no routes to peers" in text
    assert "the service proxy is off" in text
    assert "no pod programmed on this node" in text
    assert "could not read: birdc: no such socket" in text


def test_a_pods_policy_shows_isolation_allows_and_drops():
    pods = Section(rows=(
        PodRow("ns/db-0", "10.244.1.7", (PolicyRow("ingress", ("ns/db-only", "ns/deny-all"),
                                                   ("ns/db-only ingress[0]: from 10.244.2.0/24 tcp/5432",), 12),
                                         PolicyRow("egress", ("ns/deny-all",), (), 0))),
        PodRow("ns/web-0", "10.244.1.8")))
    rendered = render_page(page(pods=pods))
    text = Parsed(rendered).all_text()
    assert "isolated by ns/db-only, ns/deny-all" in text and "from 10.244.2.0/24 tcp/5432" in text
    assert "12 packet(s) denied" in text and "allows nothing" in text
    assert rendered.count('<span class="open">open</span>') == 2   # web-0, both ways
    assert "(2)" in text


def test_peers_name_their_node_or_say_unknown():
    text = Parsed(render_page(page(peers=Section(rows=(
        RouteRow("10.244.2.0/24", "10.244.2.0", "na-vxlan", "node-2"), RouteRow("10.244.3.0/24", "", "na-vxlan")))))
    ).all_text()
    assert "node-2" in text and "10.244.2.0/24" in text and "?" in text


def test_the_index_links_to_the_page():
    parsed = Parsed(render_index())
    assert ("href", "/status") in parsed.attributes
