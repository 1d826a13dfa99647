"""scripts/conformance's pure parts (lab/kubernetes/conformance.py): the argv of each suite's dry
run and real run, the skip table and its rendering, and the verdict read from a JUnit report as
the e2e framework writes it. No cluster, no binary."""
from __future__ import annotations

import re

import pytest

from lab.kubernetes import conformance
from lab.kubernetes.conformance import (
    SKIPS, SUITE_FOCUS, ClusterAccess, Outcome, Programs, ReportEntry, exit_code, read_report,
    render_skip_table, select, selected_specs, summarize,
)
from lab.state import LabError

PROGRAMS = Programs(e2e="/bin/e2e-network.test", ginkgo="/bin/ginkgo")
CLUSTER = ClusterAccess(router_netns="na-k8s-rtr", kubeconfig="/lab/admin.kubeconfig", kubectl="/venv/kubectl")


def flag_values(argv: list[str], name: str) -> list[str]:
    return [arg.split("=", 1)[1] for arg in argv if arg.startswith(name + "=")]


# ---------------------------------------------------------------- selection

@pytest.mark.parametrize("suite", sorted(SUITE_FOCUS))
def test_each_suite_dry_runs_the_binary_alone_with_its_focus_and_no_cluster(suite):
    argv = conformance.dry_run_command(PROGRAMS, select(suite), report_dir="/r")
    assert argv[0] == PROGRAMS.e2e                          # Ginkgo dry-runs only serially: never the CLI
    assert flag_values(argv, "--ginkgo.focus") == [SUITE_FOCUS[suite]]
    assert "--ginkgo.dry-run" in argv
    assert flag_values(argv, "--report-dir") == ["/r"]
    assert not flag_values(argv, "--kubeconfig")            # no cluster needed to list specs
    assert not any(arg.startswith("--focus") for arg in argv)


def test_suite_focus_is_upstreams_and_kube_network_policies():
    assert SUITE_FOCUS["conformance"] == r"\[sig-network\].*\[Conformance\]"
    assert SUITE_FOCUS["netpol"] == "Netpol"


def test_parallel_run_is_ginkgo_in_the_router_namespace_with_the_framework_flags_after_the_binary():
    argv = conformance.run_command(PROGRAMS, select("netpol"), cluster=CLUSTER, report_dir="/r", procs=2,
                                   timeout="3h")
    assert argv[:6] == ["ip", "netns", "exec", "na-k8s-rtr", PROGRAMS.ginkgo, "--procs=2"]
    binary = argv.index(PROGRAMS.e2e)
    ginkgo_part, suite_part = argv[6:binary], argv[binary + 1:]
    assert flag_values(ginkgo_part, "--focus") == ["Netpol"]
    assert flag_values(ginkgo_part, "--timeout") == ["3h"]
    assert {"--no-color", "--v"} <= set(ginkgo_part)
    assert "--dry-run" not in ginkgo_part
    assert suite_part[0] == "--"
    assert not any(arg.startswith("--ginkgo.") for arg in suite_part)
    assert flag_values(suite_part, "--kubeconfig") == [CLUSTER.kubeconfig]
    assert flag_values(suite_part, "--kubectl-path") == [CLUSTER.kubectl]
    assert flag_values(suite_part, "--provider") == ["local"]
    assert flag_values(suite_part, "--dns-domain") == ["cluster.local"]
    assert flag_values(suite_part, "--node-os-distro") == ["debian"]
    assert flag_values(suite_part, "--e2e-output-dir") == ["/r/output"]
    assert flag_values(suite_part, "--disable-log-dump") == ["true"]


def test_one_process_runs_the_binary_itself_with_ginkgo_flags_in_its_spelling():
    argv = conformance.run_command(PROGRAMS, select("conformance"), cluster=CLUSTER, report_dir="/r", procs=1,
                                   timeout="24h")
    assert argv[:5] == ["ip", "netns", "exec", "na-k8s-rtr", PROGRAMS.e2e]
    assert PROGRAMS.ginkgo not in argv
    assert flag_values(argv, "--ginkgo.focus") == [SUITE_FOCUS["conformance"]]
    assert flag_values(argv, "--ginkgo.label-filter") == ["Feature: isSubsetOf {NetworkPolicy}"]
    assert {"--ginkgo.no-color", "--ginkgo.v"} <= set(argv)
    assert "--ginkgo.dry-run" not in argv


def test_focus_replaces_the_suites_and_skip_adds_to_the_table():
    selection = select("netpol", focus="Netpol.*UDP", extra_skip="named port")
    assert selection.focus == "Netpol.*UDP"
    assert selection.skip == conformance.skip_regex(SKIPS) + "|(?:named port)"
    with pytest.raises(LabError, match="--suite"):
        select("sig-storage")


@pytest.mark.parametrize("spec, skipped", [
    ("[sig-network] Netpol [Feature:SCTPConnectivity] [LinuxOnly] NetworkPolicy between server and client using SCTP "
     "should support a 'default-deny-ingress' policy [Feature:NetworkPolicy]", True),
    ("[sig-network] Services should work after restarting apiserver [Disruptive]", True),
    ("[sig-network] DNS should provide DNS for the cluster [Provider:gce]", True),
    ("[sig-network] LoadBalancers [Feature:LoadBalancer] should be able to change the type and ports of a TCP service "
     "[Slow]", True),
    ("[sig-network] [Feature:IPv6DualStack] should create pod, add ipv6 and ipv4 ip to pod ips", True),
    ("[sig-network] Networking should provide Internet connection for containers [Feature:Networking-IPv4]", True),
    # the ones the suites are for
    ("[sig-network] DNS should provide DNS for the cluster [Conformance]", False),
    ("[sig-network] Netpol NetworkPolicy between server and client should not mistakenly treat 'protocol: SCTP' as "
     "'protocol: TCP', even if the plugin doesn't support SCTP [Feature:NetworkPolicy]", False),
    ("[sig-network] Netpol API should support creating NetworkPolicy API operations", False),
])
def test_skip_regex_matches_what_the_table_names(spec, skipped):
    # Python's re and Go's RE2 agree on these patterns (escaped brackets, alternation, groups)
    assert bool(re.search(select("all").skip, spec)) is skipped


def test_every_skip_has_a_reason_and_the_rendering_shows_each():
    text = render_skip_table(SKIPS)
    for rule in SKIPS:
        assert rule.reason.strip()
        assert f"  {rule.pattern}\n" in text
        assert rule.reason.split()[0] in text
    assert "Feature: isSubsetOf {NetworkPolicy}" in text


# ---------------------------------------------------------------- the JUnit verdict

CONFORMANCE_A = "[sig-network] DNS should provide DNS for services [Conformance]"
CONFORMANCE_B = "[sig-network] Services should serve a basic endpoint from pods [Conformance]"
CONFORMANCE_C = "[sig-network] HostPort validates that there is no conflict [LinuxOnly] [Conformance]"
CONFORMANCE_D = "[sig-network] Proxy version v1 should proxy through a service and a pod [Conformance]"
CONFORMANCE_E = "[sig-network] Services should delete a collection of services [Conformance]"
NEEDS_NODES = "[sig-network] Services should be able to create a functioning NodePort service [Conformance]"
OUTSIDE = "[sig-apps] CronJob should delete failed finished jobs with limit of one job"


def write_report(path, cases: str) -> str:
    """A report in the shape test/e2e/framework/internal/junit writes (Ginkgo's JUnit reporter)."""
    path.write_text(f"""<?xml version="1.0" encoding="UTF-8"?>
  <testsuites tests="9" disabled="2" errors="1" failures="2" time="61.5">
      <testsuite name="Kubernetes e2e suite" tests="9" disabled="0" skipped="2" errors="1" failures="2">
          <properties><property name="SuiteSucceeded" value="false"></property></properties>
{cases}
      </testsuite>
  </testsuites>
""")
    return str(path)


RUN_CASES = f"""
          <testcase name="[SynchronizedAfterSuite]" status="passed" time="0.1"></testcase>
          <testcase name="[SynchronizedBeforeSuite]" status="passed" time="3"></testcase>
          <testcase name="[It] {CONFORMANCE_A}" classname="Kubernetes e2e suite" status="passed" time="20"></testcase>
          <testcase name="[It] {CONFORMANCE_B}" classname="Kubernetes e2e suite" status="passed" time="9"></testcase>
          <testcase name="[It] {CONFORMANCE_C}" classname="Kubernetes e2e suite" status="failed" time="30">
              <failure type="failed">[FAILED] Can not connect from e2e-host-exec to pod(pod1)</failure>
              <system-err>log</system-err>
          </testcase>
          <testcase name="[It] {CONFORMANCE_D}" classname="Kubernetes e2e suite" status="interrupted" time="5">
              <error type="interrupted">Interrupted by User</error>
          </testcase>
          <testcase name="[It] {NEEDS_NODES}" classname="Kubernetes e2e suite" status="skipped" time="0.4">
              <skipped message="skipped - Requires at least 2 nodes (not 1)"></skipped>
          </testcase>
          <testcase name="[It] {CONFORMANCE_E}" classname="Kubernetes e2e suite" status="skipped" time="0">
              <skipped message="skipped"></skipped>
          </testcase>
          <testcase name="[It] {OUTSIDE}" classname="Kubernetes e2e suite" status="skipped" time="0">
              <skipped message="skipped"></skipped>
          </testcase>
"""
SELECTED = ["[It] " + name for name in (CONFORMANCE_A, CONFORMANCE_B, CONFORMANCE_C, CONFORMANCE_D, CONFORMANCE_E,
                                        NEEDS_NODES)]


def test_report_entries_keep_outcome_and_skip_message(tmp_path):
    entries = read_report(write_report(tmp_path / "junit_01.xml", RUN_CASES))
    by_name = {entry.name: entry for entry in entries}
    assert by_name["[SynchronizedBeforeSuite]"].outcome is Outcome.PASSED
    assert not by_name["[SynchronizedBeforeSuite]"].is_spec
    assert by_name[f"[It] {CONFORMANCE_C}"].outcome is Outcome.FAILED
    assert by_name[f"[It] {CONFORMANCE_D}"].outcome is Outcome.FAILED      # an <error>: interrupted
    assert by_name[f"[It] {NEEDS_NODES}"] == ReportEntry(f"[It] {NEEDS_NODES}", Outcome.SKIPPED,
                                                         "skipped - Requires at least 2 nodes (not 1)")


def test_summary_counts_selected_specs_and_keeps_the_unselected_apart(tmp_path):
    summary = summarize(read_report(write_report(tmp_path / "junit_01.xml", RUN_CASES)), SELECTED)
    assert (summary.passed, summary.failed, summary.skipped, summary.not_selected) == (2, 2, 2, 1)
    assert summary.closing_line == "2 passed, 2 failed, 2 skipped"
    assert summary.failures == (CONFORMANCE_C, CONFORMANCE_D)
    assert dict(summary.skips) == {NEEDS_NODES: "Requires at least 2 nodes (not 1)",
                                   CONFORMANCE_E: "selected but not run (the run stopped early)"}


def test_without_the_selection_a_bare_skip_is_taken_as_not_selected(tmp_path):
    summary = summarize(read_report(write_report(tmp_path / "junit_01.xml", RUN_CASES)), None)
    assert summary.closing_line == "2 passed, 2 failed, 1 skipped"
    assert summary.not_selected == 2


def test_a_failed_suite_setup_is_a_failure_and_its_unrun_specs_are_skipped(tmp_path):
    cases = f"""
          <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="failed" time="600">
              <failure type="failed">there are currently no ready, schedulable nodes in the cluster</failure>
          </testcase>
          <testcase name="[It] {CONFORMANCE_A}" classname="Kubernetes e2e suite" status="skipped" time="0">
              <skipped message="skipped"></skipped>
          </testcase>
"""
    summary = summarize(read_report(write_report(tmp_path / "junit_01.xml", cases)), ["[It] " + CONFORMANCE_A])
    assert summary.closing_line == "0 passed, 1 failed, 1 skipped"
    assert summary.failures == ("[SynchronizedBeforeSuite]",)
    assert exit_code(summary, 1) == conformance.EXIT_FAILED


def test_a_parallel_run_whose_setup_failed_lists_no_spec_and_the_selected_count_as_skipped(tmp_path):
    # what ginkgo --procs 2 wrote when the API server was unreachable: both processes' setup, no spec
    cases = """
          <testcase name="[SynchronizedBeforeSuite]" status="failed" time="40">
              <failure type="failed">SynchronizedBeforeSuite failed on Ginkgo parallel process #1</failure>
          </testcase>
          <testcase name="[SynchronizedBeforeSuite]" status="timedout" time="40">
              <failure type="timedout">A suite timeout occurred</failure>
          </testcase>
          <testcase name="[SynchronizedAfterSuite]" status="passed" time="0"></testcase>
"""
    summary = summarize(read_report(write_report(tmp_path / "junit_01.xml", cases)), SELECTED[:2])
    assert summary.closing_line == "0 passed, 2 failed, 2 skipped"
    assert {why for _spec, why in summary.skips} == {"selected but not run (not in the report)"}


def test_dry_run_report_gives_the_selection(tmp_path):
    cases = f"""
          <testcase name="[SynchronizedAfterSuite]" status="passed" time="0"></testcase>
          <testcase name="[It] {CONFORMANCE_A}" classname="Kubernetes e2e suite" status="passed" time="0"></testcase>
          <testcase name="[It] {OUTSIDE}" classname="Kubernetes e2e suite" status="skipped" time="0">
              <skipped message="skipped"></skipped>
          </testcase>
"""
    assert selected_specs(read_report(write_report(tmp_path / "junit_01.xml", cases))) == ["[It] " + CONFORMANCE_A]


def test_exit_code_is_zero_only_with_a_report_no_failure_and_a_clean_exit(tmp_path):
    clean = summarize([ReportEntry("[It] " + CONFORMANCE_A, Outcome.PASSED),
                       ReportEntry("[It] " + NEEDS_NODES, Outcome.SKIPPED, "skipped - Requires 2 nodes")], None)
    assert clean.closing_line == "1 passed, 0 failed, 1 skipped"
    assert exit_code(clean, 0) == 0
    assert exit_code(clean, 1) == conformance.EXIT_FAILED          # the suite itself said no
    assert exit_code(None, 0) == conformance.EXIT_FAILED           # no report: nothing is known
    failed = summarize([ReportEntry("[It] " + CONFORMANCE_A, Outcome.FAILED)], None)
    assert exit_code(failed, 0) == conformance.EXIT_FAILED
