"""The socket load balancer's flow events on the real kernel: the programs compiled by bcc over a
private bpffs and attached to a test-made cgroup, real connects from a test-made network namespace,
the pinned ring buffer read by ebpf/ringbuf.py and turned into flow records by proxy/ebpf/flows.py.
The TRANSLATED flow must name the backend the connection really reached (the server says who it
is); a Service without endpoints gives a DROPPED `no-endpoints` flow as the connect is refused."""
import json
import time

import pytest

from netagent.infra.flows import FlowRing, LostReason, Verdict
from netagent.kernel.families import IpFamily
from proxy.ebpf.flows import EbpfFlows, open_events, set_flow_events
from tests.netns.ebpf_fixtures import bpf_root, require_bcc, run_in_cgroup, test_cgroup  # noqa: F401
from tests.netns.test_ebpf_socket_lb import CLUSTER_IPS, family_backend, lab, service_state  # noqa: F401

CONNECTS = r"""
import errno, json, socket, sys
web, empty = sys.argv[1:3]
family = socket.AF_INET6 if ":" in web else socket.AF_INET
out = {"reached": [], "empty": None}
for _ in range(6):
    s = socket.socket(family); s.settimeout(30); s.connect((web, 80))
    out["reached"].append(s.recv(64).decode()); s.close()
e = socket.socket(family); e.settimeout(30)
try:
    e.connect((empty, 80)); out["empty"] = 0
except OSError as error:
    out["empty"] = error.errno
print(json.dumps(out))
"""


@pytest.fixture(autouse=True)
def _bcc():
    require_bcc()


@pytest.fixture
def flow_lab(lab, bpf_root):  # noqa: F811
    """test_ebpf_socket_lb's lab, with the directory its maps are pinned in."""
    from ebpf.loader import pin_dir
    return (*lab, pin_dir(bpf_root))


def connect(topology, paths, family: IpFamily) -> dict:
    web, _, empty, _ = CLUSTER_IPS[family]
    script = f"import sys\nsys.argv[1:] = {[web, empty]!r}\n" + CONNECTS
    result = run_in_cgroup(paths.cgroup, topology.names["cli"], script)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def wait_for(ring: FlowRing, count: int, timeout: float = 10.0) -> list:
    deadline = time.monotonic() + timeout
    while len(ring.flows()) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return ring.flows()


@pytest.mark.parametrize("family", list(IpFamily), ids=lambda f: f.label)
def test_a_connect_to_a_cluster_ip_is_a_translated_flow_naming_the_backend_reached(flow_lab, family):
    topology, backend, paths, pins = flow_lab
    family_backend(backend, family).sync(service_state(family=family), changed=None)
    ring = FlowRing(size=64)
    listener = EbpfFlows(ring, pins)
    listener.start()
    try:
        out = connect(topology, paths, family)
        flows = wait_for(ring, 7)
    finally:
        listener.stop()
    web, _, empty, _ = CLUSTER_IPS[family]
    assert out["empty"] == 111   # ECONNREFUSED
    translated = [f for f in flows if f.verdict is Verdict.TRANSLATED]
    dropped = [f for f in flows if f.verdict is Verdict.DROPPED]
    assert [f.translated_to for f in translated] == out["reached"]   # each one where its socket went, in order
    assert all((f.destination, f.destination_port, f.translated_port, f.protocol) == (web, 80, 8080, "TCP")
               for f in translated)
    assert [(f.destination, f.destination_port, f.reason) for f in dropped] == [(empty, 80, "no-endpoints")]
    assert len(flows) == 7 and ring.lost[LostReason.UNREADABLE] == ring.lost[LostReason.OVERRUN] == 0


def test_events_are_off_until_a_listener_turns_them_on_and_a_full_ring_counts_its_drops(flow_lab):
    topology, backend, paths, pins = flow_lab
    backend.sync(service_state(), changed=None)
    events = open_events(pins)
    try:
        connect(topology, paths, IpFamily.V4)
        assert events.read().records == []          # off: nothing written
        set_flow_events(pins, on=True)
        for _ in range(4):
            connect(topology, paths, IpFamily.V4)   # 28 events
        batch = events.read(limit=1)
        assert len(batch.records) == 1 and batch.lost == 0
        rest = events.read()
        assert len(rest.records) == 27 and not events.pending()
        # fill the ring (256 KiB of 72-byte records: 3640) without reading, then count the drops
        script = ("import socket\nfor _ in range(4000):\n s = socket.socket(); s.settimeout(30)\n"
                  " try: s.connect(('10.96.0.99', 80))\n except OSError: pass\n s.close()\n")
        result = run_in_cgroup(paths.cgroup, topology.names["cli"], script)
        assert result.returncode == 0, result.stderr
        full = events.read(limit=100_000)
        assert len(full.records) == events.size // 72 and full.lost == 4000 - len(full.records)
    finally:
        set_flow_events(pins, on=False)
        events.close()
