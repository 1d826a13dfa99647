"""connectivity_flows: an agent's `netagent flows --json` output parsed line by line (what does
not parse skipped), a check's flows picked by client and target (through a Service's
translation), and their verdicts worded into the reason."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from netagent.daemon import connectivity_flows as cf
from netagent.infra.flows import Flow, Verdict, render_json_lines

REPO = Path(__file__).resolve().parents[3]
CLIENT = "10.244.1.7"
GUARDED = "10.244.2.9"


def drop(source: str = CLIENT, destination: str = GUARDED, port: int = 8080, **kw) -> Flow:
    values = dict(time=1.0, verdict=Verdict.DROPPED, protocol="tcp", source=source, destination=destination,
                  source_port=40000, destination_port=port, reason="policy", direction="ingress",
                  pod="ct/guarded", policies=("ct/deny-ingress-to-guarded",))
    values.update(kw)
    return Flow(**values)  # type: ignore[arg-type]


def test_lines_that_do_not_parse_are_skipped_and_the_others_kept():
    good = render_json_lines([drop()])
    text = "\n".join(["not json", "[1, 2]", json.dumps({"verdict": "eaten"}), good, "{" * 5000,
                      json.dumps({**drop().to_dict(), "source": "not-an-address"}), ""])
    assert cf.parse_lines(text) == [drop()]
    assert cf.parse_lines("") == []


def test_the_deny_checks_drop_is_named_with_its_policy_and_node():
    flows = {"node-1": [], "node-2": [drop(), drop(source="10.244.1.8"), drop(port=9999)]}
    assert cf.verdicts(flows, CLIENT, f"{GUARDED}:8080") == [
        "dropped by policy ct/deny-ingress-to-guarded (ingress of ct/guarded) on node-2"]
    assert cf.verdicts(flows, "10.244.1.99", f"{GUARDED}:8080") == []


def test_a_service_check_follows_the_translation_to_the_endpoint():
    translated = Flow(time=1.0, verdict=Verdict.TRANSLATED, protocol="tcp", source=CLIENT, destination="10.96.0.10",
                      source_port=40000, destination_port=80, translated_to=GUARDED, translated_port=8080)
    other = drop(destination="10.244.2.10")      # an endpoint this client was not sent to
    flows = {"node-1": [translated], "node-2": [drop(), other]}
    assert cf.verdicts(flows, CLIENT, "10.96.0.10:80") == [
        "dropped by policy ct/deny-ingress-to-guarded (ingress of ct/guarded) on node-2",
        "translated to 10.244.2.9:8080 on node-1"]


def test_ipv6_addresses_match_in_any_spelling_and_names_match_nothing():
    flows = {"n": [drop(source="fd00:10:244:1::7", destination="fd00:10:244:2::9")]}
    assert cf.verdicts(flows, "fd00:10:244:1:0:0:0:7", "[fd00:10:244:2:0::9]:8080")
    assert cf.verdicts(flows, CLIENT, "echo.ns.svc:80") == []
    assert cf.split_target("10.0.0.1") is None and cf.split_target("10.0.0.1:http") is None


def test_hostile_text_from_an_agent_is_cut_to_printable_and_the_count_bounded():
    hostile = [drop(policies=(f"ct/p{i}\x1b[2J",), pod="ct/g\n") for i in range(10)]
    texts = cf.verdicts({"node-2": hostile}, CLIENT, f"{GUARDED}:8080")
    assert len(texts) == cf.MAX_VERDICTS
    assert all(t.isprintable() for t in texts)


def test_a_reason_gets_the_verdicts_or_stays_as_it_was():
    assert cf.with_verdicts("blocked (TIMEOUT)", ["dropped by policy a/b (ingress of a/c) on n"]) == \
        "blocked (TIMEOUT): dropped by policy a/b (ingress of a/c) on n"
    assert cf.with_verdicts("exit 1: TIMEOUT", []) == "exit 1: TIMEOUT"


def test_the_agent_pods_are_found_where_the_shipped_daemonset_puts_them():
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "netagent.yaml").read_text()) if d]
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    key, _, value = cf.AGENT_SELECTOR.partition("=")
    assert daemonset["metadata"]["namespace"] == cf.AGENT_NAMESPACE
    assert daemonset["spec"]["template"]["metadata"]["labels"][key] == value
    assert cf.AGENT_CONTAINER in [c["name"] for c in daemonset["spec"]["template"]["spec"]["containers"]]
    assert cf.flows_command("ct")[:3] == ["netagent", "flows", "--json"]
