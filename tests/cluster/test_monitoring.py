"""deploy/monitoring/'s rules in a real Prometheus scraping a lab's agent (issue 33, dashboards
and alerts): the rules load, an alert fires when a fault is injected and resolves when it is
removed, every dashboard query evaluates, and every netagent metric scraped is one the code
defines.

One 2-node vxlan lab (`--resync-period 5`). Debian's Prometheus (/usr/bin/prometheus, not its
service) runs inside node-1's network namespace, listening on that namespace's 127.0.0.1 and
scraping node-1's agent where the DaemonSet serves it, 127.0.0.1:10249 (the lab's other tests
read /healthz there too). Nothing is changed in the root namespace; Prometheus, its temp dir
(config, rules, TSDB) and the faults are removed by the fixtures.

Speed: a scrape and a rule evaluation every second, and the shipped rules file with two edits,
made by `fast_rules` on its text: every `for:` becomes 1 s and every group `interval:` 1 s.
The expressions are the shipped ones, unchanged.

Faults, each asserted through Prometheus' HTTP API (/api/v1/alerts: firing, then gone):
- a Node whose pod CIDR is outside the cluster CIDR: every agent rejects it
  (`netagent_rejected_objects{kind="Node",reason="outside-cluster-cidr"}`), so
  NetagentObjectsRejected fires; the Node deleted, it resolves;
- node-1's agent stopped: `up == 0`, NetagentDown fires; started again, it resolves.
Before the faults, a healthy lab fires nothing (no alert at all is firing).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse

import pytest

from lab.cluster import SERVICE_CIDR
from netagent.kernel import namespaces
from netagent.noderoutes import node_objects as nodes
from netagent.noderoutes.routing.vxlan import vtep_mac
from tests.cluster.lab_tools import lab_cluster, wait_for
from tests.unit.deploy.test_monitoring_rules import (DASHBOARD, RULES, dashboard_queries, exported_metrics,
                                              sample_names)

PROMETHEUS = "/usr/bin/prometheus"
NODE = "node-1"
LISTEN = "127.0.0.1:19090"        # inside node-1's namespace
AGENT_METRICS = "127.0.0.1:10249"
FETCH = ("import sys, urllib.request, urllib.error\n"
         "try:\n    answer = urllib.request.urlopen(sys.argv[1], timeout=10)\n"
         "except urllib.error.HTTPError as error:\n    answer = error\n"
         "sys.stdout.write(answer.read().decode())")

pytestmark = pytest.mark.skipif(not os.path.exists(PROMETHEUS),
                                reason="Debian's prometheus package is not installed (scripts/setup.sh installs it)")


def fast_rules(text: str) -> str:
    """The shipped rules with every `for:` and group `interval:` at 1 s (expressions unchanged)."""
    fast, waits = re.subn(r"^(\s+for:\s*)\S+\s*$", r"\g<1>1s", text, flags=re.M)
    fast, intervals = re.subn(r"^(\s+interval:\s*)\S+\s*$", r"\g<1>1s", fast, flags=re.M)
    assert waits >= 10 and intervals >= 1, (waits, intervals)
    return fast


class Prometheus:
    """/usr/bin/prometheus in `netns` on `LISTEN`, its files in a temp dir; `stop()` removes both."""

    def __init__(self, netns: str, lab) -> None:
        self.lab = lab
        self.dir = tempfile.mkdtemp(prefix="na-prometheus-")
        with open(os.path.join(self.dir, "rules.yaml"), "w") as out:
            out.write(fast_rules(RULES.read_text()))
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                  "rule_files": [os.path.join(self.dir, "rules.yaml")],
                  "scrape_configs": [{"job_name": "netagent", "static_configs": [{"targets": [AGENT_METRICS]}]}]}
        with open(os.path.join(self.dir, "prometheus.yml"), "w") as out:
            json.dump(config, out)     # JSON is YAML
        self.log_path = os.path.join(self.dir, "prometheus.log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [*namespaces.exec_prefix(netns), PROMETHEUS, f"--config.file={self.dir}/prometheus.yml",
                 f"--storage.tsdb.path={self.dir}/data", f"--web.listen-address={LISTEN}",
                 "--storage.tsdb.retention.time=1h", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as log:
            return log.read()[-4000:]

    def get(self, path: str, **params: str) -> dict | None:
        """An API answer's `data`, None while Prometheus does not answer with JSON (starting
        up, it answers 503 "Service Unavailable" until its storage is ready: seen on a loaded
        machine)."""
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{self.log()}")
        url = f"http://{LISTEN}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        result = self.lab.exec(NODE, [sys.executable, "-c", FETCH, url], timeout=30)
        if result.returncode != 0 or not result.stdout:
            return None
        try:
            answer = json.loads(result.stdout)
        except json.JSONDecodeError:
            return None
        assert answer.get("status") == "success", answer
        return answer["data"]

    def alerts(self, state: str = "firing") -> list[dict]:
        return [alert for alert in (self.get("/api/v1/alerts") or {}).get("alerts", []) if alert["state"] == state]

    def firing(self, name: str, **labels: str) -> list[dict]:
        return [alert for alert in self.alerts() if alert["labels"].get("alertname") == name
                and all(alert["labels"].get(k) == v for k, v in labels.items())]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def lab():
    with lab_cluster(nodes=2, mode="vxlan", pods_per_node=1, resync_period=5.0) as lab:
        yield lab


@pytest.fixture(scope="module")
def prometheus(lab):
    server = Prometheus(lab.netns_of(NODE), lab)
    try:
        wait_for(lambda: server.get("/api/v1/status/buildinfo"), timeout=180, what="prometheus to answer")
        yield server
    finally:
        server.stop()
    assert not os.path.exists(server.dir)


def rules_loaded(prometheus: Prometheus) -> list[dict]:
    groups = (prometheus.get("/api/v1/rules") or {}).get("groups", [])
    return [rule for group in groups for rule in group["rules"]]


def test_the_rules_load_and_a_healthy_lab_fires_nothing(lab, prometheus: Prometheus) -> None:
    shipped = re.findall(r"^\s+- (?:alert|record): (\S+)", RULES.read_text(), flags=re.M)
    loaded = wait_for(lambda: rules_loaded(prometheus), what="the rules to load")
    assert sorted(rule["name"] for rule in loaded) == sorted(shipped)
    wait_for(lambda: all(rule.get("lastEvaluation", "").startswith("2") and rule["health"] == "ok"
                         for rule in rules_loaded(prometheus)),
             what="every rule evaluated, healthy")
    targets = wait_for(lambda: [t for t in (prometheus.get("/api/v1/targets") or {}).get("activeTargets", [])
                                if t["health"] == "up"], what="the agent scraped")
    assert [t["labels"]["job"] for t in targets] == ["netagent"]
    # a fresh lab may briefly read as not yet synced; healthy, nothing fires nor waits to
    seen: list[list[dict]] = []

    def quiet() -> bool:
        seen[:] = [prometheus.alerts("firing") + prometheus.alerts("pending")]
        return not seen[0]
    try:
        wait_for(quiet, what="no alert firing or pending on a healthy lab")
    except AssertionError as failure:
        raise AssertionError(f"{failure}: {[a['labels'] for a in seen[0]]}") from None


def test_every_scraped_netagent_metric_is_one_the_code_defines(prometheus):
    defined = sample_names(exported_metrics())
    names = wait_for(lambda: [n for n in prometheus.get("/api/v1/label/__name__/values") or []
                              if n.startswith(("netagent_", "kubeproxy_"))], what="netagent series")
    assert len(names) >= 20, names
    assert set(names) <= defined, sorted(set(names) - defined)


def test_every_dashboard_query_evaluates(prometheus):
    dashboard = json.loads(DASHBOARD.read_text())
    with_data = 0
    for title, expr in dashboard_queries(dashboard):
        query = expr.replace("$__rate_interval", "1m").replace("$instance", ".*")
        data = prometheus.get("/api/v1/query", query=query)
        assert data is not None, f"{title}: {query} did not evaluate"
        with_data += bool(data["result"])
    assert with_data >= 15, f"only {with_data} dashboard queries have data on a lab"


def test_a_rejected_node_fires_netagent_objects_rejected_and_resolves(lab, prometheus):
    labels = {"kind": "Node", "reason": "outside-cluster-cidr"}
    assert not prometheus.firing("NetagentObjectsRejected")
    api = lab.api()
    api.create({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "services", "annotations": {
                    nodes.BACKEND_TYPE: "vxlan", nodes.PUBLIC_IP: "198.18.31.8",
                    nodes.BACKEND_DATA: json.dumps({"vtepMAC": vtep_mac("services")})}},
                "spec": {"podCIDR": str(SERVICE_CIDR), "podCIDRs": [str(SERVICE_CIDR)]}})
    try:
        started = time.monotonic()
        [alert] = wait_for(lambda: prometheus.firing("NetagentObjectsRejected", **labels),
                           what="NetagentObjectsRejected to fire")
        fired = time.monotonic() - started
        assert alert["annotations"]["summary"] == "netagent rejects 1 Node object(s): outside-cluster-cidr"
        assert alert["labels"]["severity"] == "warning"
    finally:
        api.delete("v1", "Node", "services")
    started = time.monotonic()
    wait_for(lambda: not prometheus.firing("NetagentObjectsRejected"), what="NetagentObjectsRejected to resolve")
    print(f"\nNetagentObjectsRejected fired {fired:.1f} s after the Node, resolved "
          f"{time.monotonic() - started:.1f} s after its deletion")


def test_a_stopped_agent_fires_netagent_down_and_resolves(lab, prometheus):
    assert not prometheus.firing("NetagentDown")
    lab.stop_agent(NODE)
    try:
        started = time.monotonic()
        [alert] = wait_for(lambda: prometheus.firing("NetagentDown"), what="NetagentDown to fire")
        fired = time.monotonic() - started
        assert alert["labels"]["instance"] == AGENT_METRICS and alert["labels"]["severity"] == "critical"
        assert alert["annotations"]["summary"] == f"netagent on {AGENT_METRICS} is down"
    finally:
        lab.start_agent(NODE)
    started = time.monotonic()
    wait_for(lambda: not prometheus.firing("NetagentDown"), what="NetagentDown to resolve")
    print(f"\nNetagentDown fired {fired:.1f} s after the agent stopped, resolved "
          f"{time.monotonic() - started:.1f} s after it started again")
