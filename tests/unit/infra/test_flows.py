"""infra/flows.py: the ring's bound and rate, sequence numbers for --follow, the filters, the
/flows page read back (and refused when malformed), the table, and the metrics."""
from __future__ import annotations

import json

import pytest

from netagent.infra.flows import (
    Flow, FlowFilter, FlowRing, LostReason, Verdict, parse_page, render_json_lines, render_table)
from netagent.infra.metrics import Registry


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def drop(n: int = 0, **values) -> Flow:
    base = dict(time=1_800_000_000.5 + n, verdict=Verdict.DROPPED, protocol="tcp", source="10.0.0.3",
                destination="10.0.0.2", source_port=40000 + n, destination_port=80, source_pod="y/b",
                destination_pod="x/a", reason="policy", direction="ingress", pod="x/a", policies=("x/deny",))
    base.update(values)
    return Flow(**base)


def test_the_ring_keeps_the_newest_and_numbers_them():
    ring = FlowRing(size=3, max_per_second=100, clock=Clock())
    for n in range(5):
        assert ring.add(drop(n))
    held = ring.flows()
    assert [f.source_port for f in held] == [40002, 40003, 40004]
    assert [f.sequence for f in held] == [3, 4, 5]
    assert [f.sequence for f in ring.flows(after=4)] == [5]


def test_over_the_rate_flows_are_sampled_out_and_counted():
    clock, registry = Clock(), Registry()
    ring = FlowRing(size=100, max_per_second=10, registry=registry, clock=clock)
    taken = sum(ring.add(drop(n)) for n in range(25))
    assert taken == 10 and ring.lost[LostReason.SAMPLED_OUT] == 15
    clock.now += 0.5                       # half a second refills five
    assert sum(ring.add(drop(n)) for n in range(25)) == 5
    text = registry.render()
    assert 'netagent_flows_total{verdict="dropped",policy="x/deny"} 15' in text
    assert 'netagent_flows_lost_total{reason="sampled-out"} 35' in text


def test_lost_reasons_are_counted():
    registry = Registry()
    ring = FlowRing(registry=registry)
    ring.lose(LostReason.OVERRUN, 2)
    ring.lose(LostReason.UNREADABLE, 0)
    assert ring.lost[LostReason.OVERRUN] == 2
    assert 'netagent_flows_lost_total{reason="kernel-overrun"} 2' in registry.render()


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        FlowRing(size=0)
    with pytest.raises(ValueError):
        FlowRing(max_per_second=0)


@pytest.mark.parametrize("keep, expected", [
    (FlowFilter(), True),
    (FlowFilter(pod="x/a"), True),
    (FlowFilter(pod="a"), True),
    (FlowFilter(pod="y/b"), True),
    (FlowFilter(pod="x/b"), False),
    (FlowFilter(pod="c"), False),
    (FlowFilter(namespace="x"), True),
    (FlowFilter(namespace="z"), False),
    (FlowFilter(verdict=Verdict.DROPPED), True),
    (FlowFilter(verdict=Verdict.FORWARDED), False),
    (FlowFilter(namespace="y", verdict=Verdict.DROPPED, pod="b"), True),
])
def test_filters(keep, expected):
    assert keep.keeps(drop()) is expected


def test_a_flow_of_unknown_addresses_is_kept_only_without_pod_filters():
    outside = drop(source_pod="", destination_pod="", pod="")
    assert FlowFilter().keeps(outside) and not FlowFilter(namespace="x").keeps(outside)


def test_the_page_reads_back():
    ring = FlowRing(clock=Clock())
    ring.add(drop(1))
    ring.add(drop(2, source="fd00::3", destination="fd00::2", source_pod="", policies=()))
    ring.lose(LostReason.OVERRUN)
    page = parse_page(ring.to_json())
    assert page.flows == ring.flows() and page.lost["kernel-overrun"] == 1


@pytest.mark.parametrize("text", ["", "[]", "{}", '{"flows": [1]}', '{"flows": [{"verdict": "maybe"}]}',
                                  '{"flows": [{"verdict": "dropped", "time": "x", "protocol": "tcp", '
                                  '"source": "a", "destination": "b"}]}',
                                  '{"flows": [{"verdict": "dropped", "nonsense": 1}]}'])
def test_a_malformed_page_is_a_clear_error(text):
    with pytest.raises(ValueError, match="/flows page"):
        parse_page(text)


def test_table_and_json_lines():
    flows = [drop(1), drop(2, source="fd00::3", source_pod="", source_port=5, verdict=Verdict.FORWARDED,
                          reason="", policies=())]
    table = render_table(flows).splitlines()
    assert table[0].split() == ["TIME", "PROTO", "SOURCE", "DESTINATION", "VERDICT"]
    assert "y/b:40001" in table[1] and "x/a:80" in table[1]
    assert table[1].endswith("dropped by policy x/deny (ingress of x/a)")
    assert "[fd00::3]:5" in table[2] and table[2].endswith("forwarded")
    lines = render_json_lines(flows).splitlines()
    assert json.loads(lines[0])["policies"] == ["x/deny"] and json.loads(lines[1])["verdict"] == "forwarded"
