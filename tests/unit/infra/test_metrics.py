"""The metrics registry renders Prometheus text 0.0.4 that a strict, independent reader
(below, also used by test_status_server) parses back to the values that were recorded."""
from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field

import pytest

from netagent.infra.metrics import (
    CONTENT_TYPE,
    SYNC_DURATION_BUCKETS,
    Registry,
    escape_help,
    escape_label_value,
    exponential_buckets,
)

# ------------------------------------------------------------------ a strict exposition reader
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass
class Family:
    name: str
    help: str | None = None
    type: str | None = None
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def value(self, sample_name: str | None = None, **labels: str) -> float:
        wanted = sample_name or self.name
        found = [v for n, ls, v in self.samples if n == wanted and ls == labels]
        assert len(found) == 1, f"{wanted}{labels}: {len(found)} samples in {self.samples}"
        return found[0]


def _unescape_help(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "\\n":
            out.append("\\" if text[i + 1] == "\\" else "\n")
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _parse_labels(text: str, i: int) -> tuple[dict[str, str], int]:
    labels: dict[str, str] = {}
    assert text[i] == "{"
    i += 1
    while text[i] != "}":
        m = _LABEL.match(text, i)
        assert m, f"bad label name at {text[i:]!r}"
        name = m.group()
        i = m.end()
        assert text[i:i + 2] == '="', f"expected =\" at {text[i:]!r}"
        i += 2
        value = []
        while text[i] != '"':
            if text[i] == "\\":
                assert text[i + 1] in _ESCAPES, f"bad escape {text[i:i + 2]!r}"
                value.append(_ESCAPES[text[i + 1]])
                i += 2
            else:
                assert text[i] != "\n"
                value.append(text[i])
                i += 1
        i += 1
        assert name not in labels, f"duplicate label {name}"
        labels[name] = "".join(value)
        if text[i] == ",":
            i += 1
    return labels, i + 1


def _parse_value(text: str) -> float:
    special = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    return special[text] if text in special else float(text)


def _family_of(sample: str, families: dict[str, Family]) -> Family:
    if sample in families:
        return families[sample]
    for suffix in ("_bucket", "_sum", "_count"):
        base = sample[: -len(suffix)]
        if sample.endswith(suffix) and families.get(base) and families[base].type == "histogram":
            return families[base]
    raise AssertionError(f"sample {sample} has no TYPE line before it")


def parse_exposition(text: str) -> dict[str, Family]:
    assert text.endswith("\n"), "exposition must end with a newline"
    families: dict[str, Family] = {}
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            keyword, rest = line[2:6], line[7:]
            name, _, payload = rest.partition(" ")
            assert _NAME.fullmatch(name), f"bad metric name {name!r}"
            family = families.setdefault(name, Family(name))
            if keyword == "HELP":
                assert family.help is None, f"second HELP for {name}"
                family.help = _unescape_help(payload)
            else:
                assert family.type is None, f"second TYPE for {name}"
                assert not family.samples, f"TYPE after samples for {name}"
                assert payload in {"counter", "gauge", "histogram", "summary", "untyped"}
                family.type = payload
            continue
        assert line and not line.startswith("#"), f"unexpected line {line!r}"
        m = _NAME.match(line)
        assert m, f"bad sample line {line!r}"
        sample, i = m.group(), m.end()
        labels: dict[str, str] = {}
        if line[i] == "{":
            labels, i = _parse_labels(line, i)
        assert line[i] == " ", f"expected a space in {line!r}"
        fields = line[i + 1:].split(" ")
        assert len(fields) in (1, 2), f"bad value/timestamp in {line!r}"
        _family_of(sample, families).samples.append((sample, labels, _parse_value(fields[0])))
    return families


# ------------------------------------------------------------------ tests
def test_counter_renders_help_type_and_value():
    registry = Registry()
    syncs = registry.counter("netagent_syncs_total", "Syncs run.")
    syncs.inc()
    syncs.inc(2.5)
    text = registry.render()
    assert text == ("# HELP netagent_syncs_total Syncs run.\n"
                    "# TYPE netagent_syncs_total counter\n"
                    "netagent_syncs_total 3.5\n")
    family = parse_exposition(text)["netagent_syncs_total"]
    assert (family.type, family.help, family.value()) == ("counter", "Syncs run.", 3.5)


def test_counter_refuses_to_go_down():
    counter = Registry().counter("c_total", "c")
    with pytest.raises(ValueError):
        counter.inc(-1)
    assert counter.value == 0


def test_gauge_set_inc_dec_and_labelled_children():
    registry = Registry()
    routes = registry.gauge("netagent_routes", "Routes programmed.", labels=("backend", "family"))
    routes.labels(backend="vxlan", family="ipv4").set(10)
    routes.labels(backend="vxlan", family="ipv4").inc(3)
    routes.labels(backend="host-gw", family="ipv4").dec()
    up = registry.gauge("netagent_up", "Agent up.")
    up.set(1)
    families = parse_exposition(registry.render())
    assert families["netagent_routes"].value(backend="vxlan", family="ipv4") == 13
    assert families["netagent_routes"].value(backend="host-gw", family="ipv4") == -1
    assert families["netagent_up"].value() == 1
    assert families["netagent_routes"].type == "gauge"


def test_children_render_sorted_and_removable():
    registry = Registry()
    gauge = registry.gauge("g", "g", labels=("svc",))
    for svc in ("c", "b", "a"):
        gauge.labels(svc=svc).set(1)
    gauge.remove(svc="b")
    gauge.remove(svc="never-existed")
    lines = [line for line in registry.render().splitlines() if not line.startswith("#")]
    assert lines == ['g{svc="a"} 1', 'g{svc="c"} 1']
    gauge.clear()
    assert parse_exposition(registry.render())["g"].samples == []


def test_label_values_are_escaped_and_read_back_intact():
    registry = Registry()
    counter = registry.counter("odd_total", "Help with \\ backslash\nand a newline.", labels=("v",))
    nasty = 'C:\\path "quoted"\nsecond line'
    counter.labels(v=nasty).inc()
    text = registry.render()
    assert 'odd_total{v="C:\\\\path \\"quoted\\"\\nsecond line"} 1' in text
    assert "# HELP odd_total Help with \\\\ backslash\\nand a newline." in text
    family = parse_exposition(text)["odd_total"]
    assert family.value(v=nasty) == 1
    assert family.help == "Help with \\ backslash\nand a newline."


def test_escape_functions():
    assert escape_label_value('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    assert escape_help('a\\b"c\nd') == 'a\\\\b"c\\nd'


def test_wrong_or_missing_labels_are_refused():
    registry = Registry()
    labelled = registry.counter("l_total", "l", labels=("a", "b"))
    with pytest.raises(ValueError):
        labelled.labels(a="1")
    with pytest.raises(ValueError):
        labelled.labels(a="1", b="2", c="3")
    with pytest.raises(ValueError):
        labelled.inc()
    plain = registry.counter("p_total", "p")
    with pytest.raises(ValueError):
        plain.labels(a="1")


@pytest.mark.parametrize("name,labels", [("1bad", ()), ("bad-name", ()), ("ok", ("bad-label",)),
                                         ("ok", ("__reserved",)), ("ok", ("a", "a"))])
def test_invalid_names_are_refused(name, labels):
    with pytest.raises(ValueError):
        Registry().gauge(name, "x", labels=labels)


def test_duplicate_and_colliding_names_are_refused():
    registry = Registry()
    registry.histogram("sync_duration_seconds", "d")
    with pytest.raises(ValueError):
        registry.counter("sync_duration_seconds", "again")
    with pytest.raises(ValueError):
        registry.gauge("sync_duration_seconds_count", "collides with the histogram's _count")
    with pytest.raises(ValueError):
        registry.histogram("h", "h", labels=("le",))


def test_histogram_buckets_are_cumulative_with_inf_sum_and_count():
    registry = Registry()
    hist = registry.histogram("sync_seconds", "Sync time.", labels=("kind",), buckets=(0.1, 0.5, 1.0))
    for value in (0.05, 0.1, 0.3, 0.7, 2.0, 5.0):
        hist.labels(kind="full").observe(value)
    text = registry.render()
    assert 'sync_seconds_bucket{kind="full",le="0.1"} 2' in text
    assert 'sync_seconds_bucket{kind="full",le="1.0"} 4' in text
    assert 'sync_seconds_bucket{kind="full",le="+Inf"} 6' in text
    family = parse_exposition(text)["sync_seconds"]
    assert family.type == "histogram"
    buckets = [(labels["le"], value) for name, labels, value in family.samples if name.endswith("_bucket")]
    assert buckets == [("0.1", 2), ("0.5", 3), ("1.0", 4), ("+Inf", 6)]
    assert family.value("sync_seconds_count", kind="full") == 6
    assert family.value("sync_seconds_sum", kind="full") == pytest.approx(8.15)
    assert [name for name, _, _ in family.samples][-2:] == ["sync_seconds_sum", "sync_seconds_count"]


def test_histogram_default_buckets_are_kube_proxy_sync_buckets():
    registry = Registry()
    hist = registry.histogram("d_seconds", "d")
    hist.observe(0.003)
    assert hist.count == 1 and hist.sum == 0.003
    family = parse_exposition(registry.render())["d_seconds"]
    bounds = [float(labels["le"]) for name, labels, _ in family.samples if name == "d_seconds_bucket"]
    assert bounds == [0.001 * 2 ** i for i in range(15)] + [math.inf]
    assert family.value("d_seconds_bucket", le="0.002") == 0
    assert family.value("d_seconds_bucket", le="0.004") == 1


def test_exponential_buckets():
    assert exponential_buckets(1, 2, 4) == (1, 2, 4, 8)
    assert SYNC_DURATION_BUCKETS[0] == 0.001 and len(SYNC_DURATION_BUCKETS) == 15
    for bad in ((0, 2, 3), (1, 1, 3), (1, 2, 0)):
        with pytest.raises(ValueError):
            exponential_buckets(*bad)
    with pytest.raises(ValueError):
        Registry().histogram("h", "h", buckets=(1.0, 1.0))


def test_callback_gauge_is_read_at_scrape_time():
    registry = Registry()
    size = {"value": 3}
    registry.callback_gauge("cache_entries", "Entries.", lambda: size["value"])
    per_backend = {("vxlan",): 2, ("host-gw",): 5}
    registry.callback_gauge("peers", "Peers.", lambda: per_backend, labels=("backend",))
    assert parse_exposition(registry.render())["cache_entries"].value() == 3
    size["value"] = 7
    per_backend[("ipip",)] = 1
    families = parse_exposition(registry.render())
    assert families["cache_entries"].value() == 7
    assert families["peers"].value(backend="ipip") == 1
    assert families["peers"].type == "gauge"


def test_a_failing_callback_drops_only_its_own_samples():
    registry = Registry()

    def broken():
        raise RuntimeError("cache gone")

    registry.callback_gauge("broken", "b", broken)
    registry.callback_gauge("wrong_shape", "w", lambda: {("a", "b"): 1}, labels=("x",))
    registry.gauge("fine", "f").set(1)
    families = parse_exposition(registry.render())
    assert families["broken"].samples == [] and families["wrong_shape"].samples == []
    assert families["fine"].value() == 1


def test_special_values_render_as_prometheus_spells_them():
    registry = Registry()
    for name, value in (("pos", math.inf), ("neg", -math.inf), ("nan", math.nan), ("frac", 0.25)):
        registry.gauge(name, name).set(value)
    text = registry.render()
    assert "pos +Inf\n" in text and "neg -Inf\n" in text and "nan NaN\n" in text
    assert "frac 0.25\n" in text
    families = parse_exposition(text)
    assert math.isnan(families["nan"].value()) and families["frac"].value() == 0.25


def test_empty_registry_renders_nothing_and_content_type_is_0_0_4():
    assert Registry().render() == ""
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_concurrent_updates_are_not_lost():
    registry = Registry()
    counter = registry.counter("hits_total", "h", labels=("worker",))
    hist = registry.histogram("lat_seconds", "l", buckets=(1.0,))

    def work(worker: int) -> None:
        for _ in range(2000):
            counter.labels(worker=str(worker % 2)).inc()
            hist.observe(0.5)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for _ in range(20):
        parse_exposition(registry.render())      # scrapes during updates stay well-formed
    for t in threads:
        t.join()
    families = parse_exposition(registry.render())
    assert families["hits_total"].value(worker="0") + families["hits_total"].value(worker="1") == 8000
    assert families["lat_seconds"].value("lat_seconds_count") == 8000
    assert families["lat_seconds"].value("lat_seconds_bucket", le="1.0") == 8000
