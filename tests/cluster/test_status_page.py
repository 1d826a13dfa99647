"""The status page (issue 33, "a picture for the status commands") in a real headless browser:
Debian's chromium loads `/status` from a lab agent's metrics address and from
`netagent status html --html FILE`, and what it shows is what the lab made.

One 2-node vxlan lab with network policy on: a Service `web` in front of pod `web-1` on
node-1, a client pod on node-2, and a NetworkPolicy isolating `web-1`. chromium runs inside
node-1's network namespace (`ip netns exec`), where the agent serves 127.0.0.1:10249, with a
profile and HOME of its own in a temp dir removed afterwards; it takes a 1280x2000 screenshot
(checked as a PNG of that size, decoded here with zlib and struct: more than one colour, and
the page's header colour among them) and dumps the DOM it built (the nodes, the Service, the
pod and its policy in it). The screenshot is kept at `SCREENSHOT` for a person to look at.
A hostile name (markup in a NetworkPolicy's and a pod label's place cannot reach the page:
the API refuses them; so a page rendered with one, as a file) is loaded too: the browser
builds no element from it.
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

import pytest

from netagent.daemon.status_html import (PodRow, PolicyRow, RouteRow, Section, ServiceRow, StatusPage,
                                         render_page)
from netagent.kernel import namespaces
from tests.cluster.lab_tools import ROOT, lab_cluster, wait_for

CHROMIUM = "/usr/bin/chromium"
NODE = "node-1"
STATUS_URL = "http://127.0.0.1:10249/status"
SCREENSHOT = "/tmp/netagent-status-page.png"
HEADER_COLOUR = bytes.fromhex("1f3a5f")   # status_html.py's header background
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
FETCH = ("import sys, urllib.request\n"
         "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())")

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason="Debian's chromium package is not installed (scripts/setup.sh installs it)")

POLICY = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
          "metadata": {"name": "web-from-client", "namespace": "default"},
          "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                                "ports": [{"protocol": "TCP", "port": 80}]}]}}
SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
           "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}


# ------------------------------------------------------------------ a PNG, read with the stdlib
def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def read_png(data: bytes, *, every: int = 8) -> tuple[int, int, set[bytes]]:
    """(width, height, the colours of every `every`-th row) of an 8-bit non-interlaced PNG;
    each chunk's CRC checked, every row unfiltered (rows depend on the one above)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    pos, header, idat = 8, b"", []
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in chunk {kind!r}"
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and interlace == 0 and colour_type in (0, 2, 4, 6), header
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}[colour_type]
    stride = width * bpp
    raw = zlib.decompress(b"".join(idat))
    assert len(raw) == height * (stride + 1), "image data of the wrong size"
    previous, colours = bytearray(stride), set()
    for y in range(height):
        start = y * (stride + 1)
        kind, row = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:
            for i in range(bpp, stride):
                row[i] = (row[i] + row[i - bpp]) & 255
        elif kind == 2:
            row = bytearray((a + b) & 255 for a, b in zip(row, previous))
        elif kind == 3:
            for i in range(stride):
                row[i] = (row[i] + (((row[i - bpp] if i >= bpp else 0) + previous[i]) >> 1)) & 255
        elif kind == 4:
            for i in range(stride):
                left, up_left = (row[i - bpp], previous[i - bpp]) if i >= bpp else (0, 0)
                row[i] = (row[i] + _paeth(left, previous[i], up_left)) & 255
        else:
            assert kind == 0, f"unknown filter {kind} in row {y}"
        if y % every == 0:
            colours.update(bytes(row[i:i + 3]) for i in range(0, stride, bpp))
        previous = row
    return width, height, colours


# ------------------------------------------------------------------ chromium
class Chromium:
    """chromium --headless in `netns` (None: here), a profile and HOME of its own per run."""

    def __init__(self, netns: str | None) -> None:
        self.netns = netns
        self.home = tempfile.mkdtemp(prefix="na-chromium-")

    def run(self, url: str, *extra: str) -> str:
        profile = tempfile.mkdtemp(prefix="profile-", dir=self.home)
        env = {**os.environ, "HOME": self.home, "XDG_CONFIG_HOME": self.home, "XDG_CACHE_HOME": self.home}
        done = subprocess.run([*namespaces.exec_prefix(self.netns), CHROMIUM, *FLAGS, f"--user-data-dir={profile}",
                               *extra, url], capture_output=True, text=True, timeout=60, env=env,
                              cwd=self.home)
        assert done.returncode == 0, f"chromium exited {done.returncode}: {done.stderr[-3000:]}"
        return done.stdout

    def screenshot(self, url: str, path: str) -> bytes:
        self.run(url, f"--screenshot={path}", "--window-size=1280,2000")
        with open(path, "rb") as shot:
            return shot.read()

    def dom(self, url: str) -> str:
        return self.run(url, "--dump-dom")

    def close(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture(scope="module")
def lab():
    with lab_cluster(nodes=2, mode="vxlan", network_policy=True) as made:
        made.add_pod("web-1", node=NODE, labels={"app": "web"}, ports={"http": 8080})
        made.add_pod("client", node="node-2", labels={"app": "client"})
        api = made.api()
        api.create(SERVICE)
        api.create(POLICY)
        yield made


@pytest.fixture
def chromium(lab):
    browser = Chromium(lab.netns_of(NODE))
    try:
        yield browser
    finally:
        browser.close()
    assert not os.path.exists(browser.home)


def served_page(lab) -> str:
    done = lab.exec(NODE, [sys.executable, "-c", FETCH, STATUS_URL], timeout=30)
    return done.stdout if done.returncode == 0 else ""


def complete(page: str, lab) -> bool:
    """The page shows what the lab made: node-2's route, web's endpoint, web-1 isolated."""
    web = lab.state.pods["web-1"]
    return all(part in page for part in ("node-2", lab.state.nodes["node-2"].pod_cidr, "default/web:http",
                                         f"{web.ip}:8080", "isolated by default/web-from-client"))


def test_chromium_shows_the_agents_page(lab, chromium):
    wait_for(lambda: complete(served_page(lab), lab), what="/status to show the lab's node, Service and policy")
    shot = chromium.screenshot(STATUS_URL, SCREENSHOT)
    width, height, colours = read_png(shot)
    assert (width, height) == (1280, 2000)
    assert len(colours) >= 3 and HEADER_COLOUR in colours, f"{len(colours)} colour(s)"
    dom = chromium.dom(STATUS_URL)
    assert complete(dom, lab), dom[-3000:]
    assert "<h1>netagent on node node-1</h1>" in dom and lab.state.pods["web-1"].ip in dom
    print(f"\nthe status page of {NODE}, as chromium drew it: {SCREENSHOT} ({len(shot)} bytes, "
          f"{len(colours)} colours in every 8th row)")


def test_the_command_writes_the_same_page_from_the_kernel(lab, chromium):
    wait_for(lambda: complete(served_page(lab), lab), what="/status to show the lab's node, Service and policy")
    path = os.path.join(chromium.home, "status.html")
    done = subprocess.run([*namespaces.exec_prefix(lab.netns_of(NODE)), sys.executable, "-m", "netagent.cli",
                           "status", "html", "--html", path, "--node-name", NODE],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(path) as written:
        text = written.read()
    web = lab.state.pods["web-1"]
    assert lab.state.nodes["node-2"].pod_cidr in text and "default/web:http" in text and f"{web.ip}:8080" in text
    assert "isolated by default/web-from-client" in text and "read from the kernel" in text
    dom = chromium.dom(f"file://{path}")
    assert "default/web:http" in dom and "default/web-1" in dom


def test_a_hostile_name_builds_no_element(chromium):
    hostile = '<script>document.title="pwned"</script><img src=x onerror="document.title=1">'
    path = os.path.join(chromium.home, "hostile.html")
    with open(path, "w") as out:
        out.write(render_page(StatusPage(
            node=hostile, source="a test", generated="now",
            peers=Section(rows=(RouteRow("10.244.2.0/24", node=hostile),)),
            services=Section(rows=(ServiceRow(hostile, "ClusterIP", "10.96.0.1:80", (hostile,)),)),
            pods=Section(rows=(PodRow(hostile, "10.244.1.2", (PolicyRow("ingress", (hostile,), (hostile,), 0),)),)))))
    dom = chromium.dom(f"file://{path}")
    title = dom.split("<title>", 1)[1].split("</title>", 1)[0]
    assert "<script" not in dom and "<img" not in dom and title.startswith("netagent: &lt;script&gt;")
    assert dom.count("&lt;script&gt;") >= 5
