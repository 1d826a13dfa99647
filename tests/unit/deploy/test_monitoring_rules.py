"""deploy/monitoring/ against the code: the rules and the dashboard name only metrics netagent exports.

- The exported names are read from the code's own metric definitions: every
  `registry.counter|gauge|histogram|callback_gauge("name", ...)` call and every
  `Counter|Gauge|Histogram|CallbackGauge("name", ...)` of `netagent.infra.metrics` in
  netagent/, proxy/, ebpf/ and cni/ (an AST walk, `exported_metrics`). So that walk cannot
  find nothing and let everything pass, it must find at least `MIN_EXPORTED` families, and
  the metric classes that can be built offline (the proxy's, the node agent's, the policy
  engine's, the rejections', the BGP speaker's) are built on a `Registry` whose rendered
  families must all be among them, with the same type.
- A PromQL expression's metric names are found crudely (`metric_names`): strings, label
  matchers, ranges and grouping clauses removed, then every identifier that is not a
  function, an aggregation, a keyword or a number. Each must be a sample the code exports (a
  histogram's `_bucket`, `_sum`, `_count`), `up`, or a name recorded by the rules file.
- Every alert has a `for:`, a severity and `summary`/`description` annotations; the
  dashboard is valid JSON, every panel has a query, ids are unique, and the topics the
  dashboard exists for are all on it.
- `promtool check rules` passes (skipped, saying so, only where promtool is not installed;
  `scripts/setup.sh` installs it with Debian's prometheus package).

tests/cluster/test_monitoring.py runs the rules in a real Prometheus against a lab.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "netagent-rules.yaml"
DASHBOARD = MONITORING / "netagent-dashboard.json"
SOURCES = ("netagent", "proxy", "ebpf", "cni")
MIN_EXPORTED = 30      # 37 families when this was written: far fewer means the walk broke

_REGISTRY_METHODS = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "callback_gauge": "gauge",
                     "callback_counter": "counter"}
_CLASSES = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "CallbackGauge": "gauge",
            "CallbackCounter": "counter"}
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def _metric_classes_imported(tree: ast.Module) -> dict[str, str]:
    """Local name -> metric type of the classes this module imports from netagent.infra.metrics."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "netagent.infra.metrics":
            for alias in node.names:
                if alias.name in _CLASSES:
                    found[alias.asname or alias.name] = _CLASSES[alias.name]
    return found


def exported_metrics() -> dict[str, str]:
    """Every metric family the code defines: name -> type (counter, gauge, histogram)."""
    families: dict[str, str] = {}
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            classes = _metric_classes_imported(tree)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                first = node.args[0]
                if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                    continue
                func = node.func
                if isinstance(func, ast.Attribute) and func.attr in _REGISTRY_METHODS:
                    kind = _REGISTRY_METHODS[func.attr]
                elif isinstance(func, ast.Name) and func.id in classes:
                    kind = classes[func.id]
                else:
                    continue
                if not _METRIC_NAME.match(first.value):
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                assert families.get(first.value, kind) == kind, f"{first.value} defined twice, differently ({where})"
                families[first.value] = kind
    return families


def sample_names(families: dict[str, str]) -> set[str]:
    """The series names a scrape shows: a histogram's as `_bucket`, `_sum` and `_count`."""
    names = set()
    for name, kind in families.items():
        names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram" else {name}
    return names


# ------------------------------------------------------------------ PromQL, crudely
_AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
                 "topk", "quantile"}
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
             "offset", "inf", "nan", "atan2"} | _AGGREGATIONS


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (Grafana's `$variables` allowed in matchers and ranges)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)            # strings: label values
    text = re.sub(r"\{[^}]*\}", " ", text)                      # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                     # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r" \1 ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        token = match.group(0)
        if text[match.end():].lstrip().startswith("("):        # a function or an aggregation's body
            continue
        if token.lower() in _KEYWORDS:
            continue
        names.add(token)
    return names


def test_metric_names_reads_promql_crudely_but_rightly():
    assert metric_names('sum by (instance, le) (rate(a_bucket{job="x", le!="1"}[5m]))') == {"a_bucket"}
    assert metric_names("b > 5 unless b <= 4 * avg_over_time(c:d:e[1d] offset 10m)") == {"b", "c:d:e"}
    assert metric_names('count(up{job="n", instance=~"$instance"} == 0) or vector(0)') == {"up"}
    assert metric_names("time() - max by (i) (x{a=~\"$i\"}) > 1e3") == {"x"}
    assert metric_names("topk(10, sum by (pod) (rate(y[$__rate_interval])))") == {"y"}


def load_rules() -> dict:
    return yaml.safe_load(RULES.read_text())


def rules_of(document: dict) -> list[dict]:
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_panels(dashboard: dict) -> list[dict]:
    """Every panel, rows' nested ones included."""
    out = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expression) of every target of every panel but rows."""
    return [(panel["title"], target.get("expr", "")) for panel in dashboard_panels(dashboard)
            if panel.get("type") != "row" for target in panel.get("targets", [])]


# ------------------------------------------------------------------ the tests
def test_the_metric_walk_finds_what_the_registries_hold():
    from netagent.cniserver.metrics import CniMetrics
    from netagent.infra.metrics import Registry
    from netagent.infra.process_metrics import register_process_metrics
    from netagent.infra.rejections import Rejections
    from netagent.infra.runner_metrics import register_runner_metrics
    from netagent.noderoutes.bgp.speaker import BgpSpeaker
    from netagent.noderoutes.metrics import NodeAgentMetrics
    from netagent.policy.engine import PolicyMetrics
    from proxy.metrics import ProxyMetrics

    exported = exported_metrics()
    assert len(exported) >= MIN_EXPORTED, f"only {len(exported)} metric families found: {sorted(exported)}"
    assert all(name.startswith(("netagent_", "kubeproxy_", "process_")) for name in exported), sorted(exported)
    registry = Registry()
    ProxyMetrics(registry, table_fill=lambda: {"svc": (1, 2)})
    NodeAgentMetrics(registry)
    PolicyMetrics(registry)
    Rejections(registry)
    BgpSpeaker.register_metrics(SimpleNamespace(sessions=lambda: [], skipped=()), registry)
    register_process_metrics(registry)
    register_runner_metrics(registry, lambda: [])
    CniMetrics(registry)
    built = dict(re.findall(r"^# TYPE (\S+) (\S+)$", registry.render(), flags=re.M))
    assert len(built) >= MIN_EXPORTED - 5, built
    wrong = {name: kind for name, kind in built.items() if exported.get(name) != kind}
    assert not wrong, f"registered but not found (or of another type) by the walk: {wrong}"


def test_every_metric_in_the_rules_is_exported():
    exported = sample_names(exported_metrics())
    rules = rules_of(load_rules())
    recorded = {rule["record"] for rule in rules if "record" in rule}
    unknown = {}
    for rule in rules:
        names = metric_names(rule["expr"])
        assert names, f"no metric in {rule['expr']!r}"
        missing = {n for n in names if n not in exported and n not in recorded and n != "up"}
        if missing:
            unknown[rule.get("record") or rule.get("alert")] = sorted(missing)
    assert not unknown, f"rules naming metrics the code does not export: {unknown}"
    for name in recorded:        # level:metric:operations, the metric an exported one
        level, metric, operation = name.split(":")
        assert level and operation and metric.startswith(("netagent_", "kubeproxy_")), name


def test_every_alert_says_what_it_means_and_waits():
    alerts = [rule for rule in rules_of(load_rules()) if "alert" in rule]
    assert len(alerts) >= 10
    names = [alert["alert"] for alert in alerts]
    assert len(names) == len(set(names)), names
    for alert in alerts:
        assert alert.get("for"), f"{alert['alert']}: no `for:`"
        assert alert.get("labels", {}).get("severity") in ("critical", "warning", "info"), alert["alert"]
        annotations = alert.get("annotations", {})
        assert annotations.get("summary") and annotations.get("description"), f"{alert['alert']}: annotations"
    for wanted in ("NetagentDown", "NetagentObjectsRejected", "NetagentProxySyncStale",
                   "NetagentProxyProgrammingFailures", "NetagentPolicyDropsSpike", "NetagentBGPSessionDown",
                   "NetagentPodPolicyProgrammingSlow"):
        assert wanted in names


def test_the_dashboard_queries_exported_metrics_on_every_panel():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard_panels(dashboard)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels:
        assert panel.get("title") and panel.get("gridPos"), panel.get("id")
        if panel.get("type") != "row":
            exprs = [target.get("expr", "").strip() for target in panel.get("targets", [])]
            assert exprs and all(exprs), f"panel {panel['title']!r} has no query"
    exported = sample_names(exported_metrics())
    recorded = {rule["record"] for rule in rules_of(load_rules()) if "record" in rule}
    used = set()
    for title, expr in dashboard_queries(dashboard):
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        missing = {n for n in names if n not in exported and n not in recorded and n != "up"}
        assert not missing, f"panel {title!r} queries metrics the code does not export: {sorted(missing)}"
        used |= names
    for topic in ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "netagent_rejected_objects",
                  "kubeproxy_sync_proxy_rules_iptables_restore_failures_total", "netagent_node_sync_errors_total",
                  "netagent_policy_denied_packets", "netagent_bgp_session_up",
                  "netagent_policy_pod_programming_seconds_bucket", "kubeproxy_network_programming_duration_seconds_bucket"):
        assert topic in used, f"the dashboard shows nothing of {topic}"


def test_promtool_accepts_the_rules():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package; scripts/setup.sh installs it)")
    result = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True,
                            env={**os.environ, "NO_COLOR": "1"}, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
