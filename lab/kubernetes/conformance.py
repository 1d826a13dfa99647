"""`scripts/conformance`: the upstream sig-network e2e suite against `netagent lab up --kubernetes`.

The suite is `k8s/e2e` (the upstream framework, test/e2e/network and network/netpol) built by
scripts/build-kubernetes as `e2e-network.test`, with upstream's `ginkgo` CLI for parallel runs.
This module owns what a run is: which specs a suite selects (a focus per suite, the one skip
table below with each skip's reason and evidence, the features the lab offers), the binary's and
ginkgo's arguments, where it runs (inside the lab's router namespace, which reaches the API server,
node and pod addresses directly, as the kubeconfig it is given expects) and the verdict, read
back from the JUnit report the framework writes (`<report>/junit_01.xml`; with `ginkgo --procs`
too: Ginkgo merges the processes' results and process 1 writes it).

Counting. Ginkgo lists every spec of the binary in the report, the ones outside the selection as
bare `skipped`, and a selected spec that never ran (the run was interrupted, timed out, or its
suite setup failed) looks the same. So before running, a dry run with the same selection (under a
second, no cluster) records which specs are selected, and the closing line counts:
  passed   selected specs that passed;
  failed   every report entry with a failure or error, suite setup and teardown nodes included
           (a failed `[SynchronizedBeforeSuite]` fails the run);
  skipped  selected specs that did not pass or fail: skipped by themselves at run time
           (`skipped - <reason>`, e.g. a spec needing more nodes) or never run;
specs outside the selection are reported as "not selected", never as skipped.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import enum
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Collection, Sequence

from lab.kubernetes import binaries
from lab.kubernetes.control_plane import DNS_DOMAIN
from lab.state import LabError, LabState
from netagent.kernel import namespaces


@dataclasses.dataclass(frozen=True)
class SkipRule:
    """Specs whose full text matches `pattern` (a Go regexp, as ginkgo --skip) are not run."""
    pattern: str
    reason: str


# The one skip table. The first four are the tags every upstream conformance run leaves out; the
# rest name what this lab does not have, each with the evidence. Extend it with a reason, never
# with a bare pattern.
SKIPS: tuple[SkipRule, ...] = (
    SkipRule(r"\[Serial\]", "changes what every spec shares (the default IngressClass, CoreDNS's ConfigMap, the SCTP "
                            "module); this runner runs specs side by side (--procs)"),
    SkipRule(r"\[Disruptive\]", "restarts the API server or kube-proxy, or flushes a node's iptables, over SSH "
                                "(e2essh): the lab's nodes have no SSH (no server in their namespaces, no key) "
                                "and no kube-proxy"),
    SkipRule(r"\[Slow\]", "minutes each; left out as upstream's conformance jobs do"),
    SkipRule(r"\[Flaky\]", "marked unreliable upstream"),
    SkipRule(r"\[Feature:SCTPConnectivity\]",
             "this kernel has no SCTP: socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) in a fresh network namespace "
             "fails with EPROTONOSUPPORT (kernel 6.18.44, no sctp module for it), and every node shares it"),
    SkipRule(r"\[Feature:LoadBalancer\]",
             "needs a cloud provider that implements type=LoadBalancer Services; the lab has none (--provider=local)"),
    SkipRule(r"\[Feature:IPv6DualStack\]|\[Feature:Networking-IPv6\]",
             "the cluster is IPv4-only (lab/kubernetes/cluster.py NETWORK: pods 10.244.0.0/16, Services 10.96.0.0/16)"),
    SkipRule(r"\[Feature:Networking-IPv4\]|\[Feature:Networking-DNS\]",
             "connect to 8.8.8.8 and google.com: the lab's internet is a namespace (lab/physical.py, 203.0.113.0/24) "
             "with no way out"),
    SkipRule(r"\[Provider:gce\]", "resolves google.com and GCE's metadata server"),
    SkipRule(r"\[Feature:LocalhostNodePorts\]",
             "NodePorts on 127.0.0.1 (kube-proxy's route_localnet): netagent serves NodePorts on every local "
             "address but loopback (proxy/iptables/render.py _nodeport_matches)"),
    SkipRule(r"\[Feature:KubeProxyNFAcct\]",
             "reads kube-proxy's counter of packets to localhost NodePorts, which netagent does not serve (above)"),
    SkipRule(r"\[Feature:Networking-Performance\]|\[Feature:PerformanceDNS\]",
             "measurements (iperf2 between nodes; DNS with the maximum number of Services), not correctness"),
)

# Features the lab offers. A spec labelled with any other `Feature:` is not selected, whether or
# not the table names it (ginkgo's label filter: RE2 has no lookahead to say it as a --skip).
LAB_FEATURES: tuple[str, ...] = ("NetworkPolicy",)

# --suite: the focus of each (ginkgo --focus, a Go regexp over the spec's full text)
SUITE_FOCUS: dict[str, str] = {
    "conformance": r"\[sig-network\].*\[Conformance\]",
    "netpol": r"Netpol",    # NetworkPolicy, as kube-network-policies runs it (its KUBERNETES_CONFORMANCE_TEST=y
                            # only tells upstream's hack/ginkgo-e2e.sh to skip provider setup: no effect here)
    "all": r"\[sig-network\]",
}

PROVIDER = "local"            # no cloud; `local` and `skeleton` are the framework's null providers
NODE_OS_DISTRO = "debian"     # the nodes run this host's userland (Debian 12)
DEFAULT_PROCS = 2             # this machine's cores; Netpol runs 9 pods per spec
DEFAULT_TIMEOUT = "24h"       # upstream's hack/ginkgo-e2e.sh: Ginkgo v2's 1h default is too short for Netpol
JUNIT_NAME = "junit_01.xml"   # what the framework writes into --report-dir (test_context.go)
SPEC_PREFIX = "[It] "         # how Ginkgo's JUnit names a spec (suite nodes: "[SynchronizedBeforeSuite]", ...)
GINKGO_FILTERED = "skipped"   # a skipped entry's message when Ginkgo did not run it (vs "skipped - <reason>")
EXIT_FAILED = 1
EXIT_UNUSABLE = 2


# ---------------------------------------------------------------- what a run selects

@dataclasses.dataclass(frozen=True)
class Selection:
    """The specs a run selects, in ginkgo's terms."""
    focus: str
    skip: str
    label_filter: str


def skip_regex(rules: Sequence[SkipRule], extra: str | None = None) -> str:
    """One ginkgo --skip regexp: every rule's pattern, then the caller's own."""
    patterns = [rule.pattern for rule in rules] + ([extra] if extra else [])
    return "|".join(f"(?:{pattern})" for pattern in patterns)


def feature_filter(features: Sequence[str]) -> str:
    """A ginkgo label filter selecting specs that need no feature outside `features`."""
    return f"Feature: isSubsetOf {{{', '.join(features)}}}"


def select(suite: str, *, focus: str | None = None, extra_skip: str | None = None) -> Selection:
    """`--focus` replaces the suite's focus; `--skip` adds to the table, never replaces it."""
    if suite not in SUITE_FOCUS:
        raise LabError(f"--suite {suite!r}: choose one of {', '.join(SUITE_FOCUS)}")
    return Selection(focus=focus or SUITE_FOCUS[suite], skip=skip_regex(SKIPS, extra_skip),
                     label_filter=feature_filter(LAB_FEATURES))


def render_skip_table(rules: Sequence[SkipRule]) -> str:
    """Each pattern, its reason wrapped beneath it; then the feature filter's line."""
    lines = ["skipped by design (lab/kubernetes/conformance.py):"]
    for pattern, reason in [(rule.pattern, rule.reason) for rule in rules] + [
            (feature_filter(LAB_FEATURES), "(label filter) a spec needing a Feature the lab does not offer")]:
        lines.append(f"  {pattern}")
        lines.append(textwrap.fill(reason, width=100, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(lines)


# ---------------------------------------------------------------- the command line of a run

@dataclasses.dataclass(frozen=True)
class Programs:
    e2e: str       # e2e-network.test
    ginkgo: str    # the ginkgo CLI (parallel runs)


@dataclasses.dataclass(frozen=True)
class ClusterAccess:
    """How the suite reaches the lab's cluster: from its router namespace, with the admin kubeconfig."""
    router_netns: str
    kubeconfig: str
    kubectl: str


def ginkgo_options(selection: Selection, *, timeout: str, dry_run: bool) -> list[tuple[str, str | None]]:
    """Ginkgo's options as (name, value); a None value is a boolean flag."""
    options: list[tuple[str, str | None]] = [
        ("focus", selection.focus), ("skip", selection.skip), ("label-filter", selection.label_filter),
        ("timeout", timeout), ("no-color", None), ("v", None)]
    return options + [("dry-run", None)] if dry_run else options


def suite_flags(options: Sequence[tuple[str, str | None]]) -> list[str]:
    """The options as the test binary itself takes them (`--ginkgo.focus=...`)."""
    return [f"--ginkgo.{name}" if value is None else f"--ginkgo.{name}={value}" for name, value in options]


def cli_flags(options: Sequence[tuple[str, str | None]]) -> list[str]:
    """The options as the ginkgo CLI takes them (`--focus=...`); it hands them to each process."""
    return [f"--{name}" if value is None else f"--{name}={value}" for name, value in options]


def e2e_flags(*, report_dir: str, cluster: ClusterAccess | None) -> list[str]:
    """The framework's own flags (test/e2e/framework/test_context.go); no cluster: a dry run."""
    flags = [f"--provider={PROVIDER}", f"--report-dir={report_dir}",
             f"--e2e-output-dir={os.path.join(report_dir, 'output')}", f"--node-os-distro={NODE_OS_DISTRO}",
             f"--dns-domain={DNS_DOMAIN}",
             "--disable-log-dump=true"]  # else the suite's end runs cluster/log-dump/log-dump.sh, not here
    if cluster is not None:
        flags += [f"--kubeconfig={cluster.kubeconfig}", f"--kubectl-path={cluster.kubectl}"]
    return flags


def dry_run_command(programs: Programs, selection: Selection, *, report_dir: str) -> list[str]:
    """Lists the selection without a cluster. Always the binary alone: Ginkgo dry-runs only serially."""
    options = ginkgo_options(selection, timeout=DEFAULT_TIMEOUT, dry_run=True)
    return [programs.e2e, *suite_flags(options), *e2e_flags(report_dir=report_dir, cluster=None)]


def run_command(programs: Programs, selection: Selection, *, cluster: ClusterAccess, report_dir: str,
                procs: int, timeout: str) -> list[str]:
    """The real run, inside the router namespace: the binary alone, or under ginkgo with --procs."""
    options = ginkgo_options(selection, timeout=timeout, dry_run=False)
    flags = e2e_flags(report_dir=report_dir, cluster=cluster)
    if procs > 1:
        argv = [programs.ginkgo, f"--procs={procs}", *cli_flags(options), programs.e2e, "--", *flags]
    else:
        argv = [programs.e2e, *suite_flags(options), *flags]
    return [*namespaces.exec_prefix(cluster.router_netns), *argv]


# ---------------------------------------------------------------- reading the JUnit report

class Outcome(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"      # <failure> or <error>: failed, timed out, interrupted, aborted, panicked
    SKIPPED = "skipped"    # <skipped>: not run by Ginkgo, or skipped by the spec itself


@dataclasses.dataclass(frozen=True)
class ReportEntry:
    name: str              # "[It] [sig-network] ...", or a suite node's "[SynchronizedBeforeSuite]"
    outcome: Outcome
    message: str = ""      # a skip's message

    @property
    def is_spec(self) -> bool:
        return self.name.startswith(SPEC_PREFIX)

    @property
    def spec_text(self) -> str:
        return self.name.removeprefix(SPEC_PREFIX)


def read_report(path: str) -> list[ReportEntry]:
    entries = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        skipped = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            entries.append(ReportEntry(case.get("name", ""), Outcome.FAILED))
        elif skipped is not None:
            entries.append(ReportEntry(case.get("name", ""), Outcome.SKIPPED, skipped.get("message", "")))
        else:
            entries.append(ReportEntry(case.get("name", ""), Outcome.PASSED))
    return entries


def selected_specs(dry_run_entries: Sequence[ReportEntry]) -> list[str]:
    """A dry run's report: the specs it would run are the ones that 'passed'."""
    return [entry.name for entry in dry_run_entries if entry.is_spec and entry.outcome is Outcome.PASSED]


@dataclasses.dataclass(frozen=True)
class Summary:
    passed: int
    failed: int
    skipped: int
    not_selected: int
    failures: tuple[str, ...]
    skips: tuple[tuple[str, str], ...]   # (spec, why)

    @property
    def closing_line(self) -> str:
        return f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped"


def summarize(entries: Sequence[ReportEntry], selected: Collection[str] | None) -> Summary:
    """Count as the module docstring says. `selected`: the dry run's spec names (None: unknown, every
    bare `skipped` is then taken as outside the selection)."""
    unseen = collections.Counter(selected or ())   # selected specs the report has not shown yet
    passed = not_selected = 0
    failures: list[str] = []
    skips: list[tuple[str, str]] = []
    for entry in entries:
        was_selected = unseen[entry.name] > 0
        if was_selected:
            unseen[entry.name] -= 1
        if entry.outcome is Outcome.FAILED:
            failures.append(entry.spec_text)
        elif not entry.is_spec:
            continue                         # a suite node that passed is no spec
        elif entry.outcome is Outcome.PASSED:
            passed += 1
        elif entry.message != GINKGO_FILTERED:
            skips.append((entry.spec_text, entry.message.removeprefix(GINKGO_FILTERED + " - ")))
        elif was_selected:
            skips.append((entry.spec_text, "selected but not run (the run stopped early)"))
        else:
            not_selected += 1
    # a parallel run whose suite setup failed lists no spec at all
    skips += [(name.removeprefix(SPEC_PREFIX), "selected but not run (not in the report)")
              for name in sorted(unseen.elements())]
    return Summary(passed=passed, failed=len(failures), skipped=len(skips), not_selected=not_selected,
                   failures=tuple(failures), skips=tuple(skips))


def exit_code(summary: Summary | None, suite_status: int) -> int:
    """0 only when the report exists, nothing failed and the suite itself exited 0."""
    return 0 if summary is not None and summary.failed == 0 and suite_status == 0 else EXIT_FAILED


# ---------------------------------------------------------------- driving it

def find_programs() -> Programs:
    directory = binaries.bin_dir()
    programs = Programs(e2e=os.path.join(directory, "e2e-network.test"), ginkgo=os.path.join(directory, "ginkgo"))
    missing = [path for path in (programs.e2e, programs.ginkgo) if not os.access(path, os.X_OK)]
    if missing:
        raise LabError(f"{', '.join(missing)} missing: build them with scripts/build-kubernetes")
    stale = [name for name in binaries.stale() if name in ("e2e-network.test", "ginkgo")]
    if stale:
        print(f"conformance: {', '.join(stale)} older than k8s/ (scripts/build-kubernetes rebuilds)", file=sys.stderr)
    return programs


def cluster_access(state_dir: str) -> ClusterAccess:
    path = os.path.join(state_dir, "state.json")
    try:
        with open(path) as f:
            state = LabState.from_json(json.load(f))
    except FileNotFoundError:
        raise LabError(f"no lab is up (no {path}); start one with `netagent lab up --kubernetes`") from None
    if state.kubernetes is None:
        raise LabError(f"the lab in {state_dir} is not a Kubernetes lab (`netagent lab up --kubernetes`)")
    from lab.kubernetes.cluster import KubernetesLab, kubectl_binary  # only once a cluster is there
    kubeconfig = KubernetesLab.load(state).admin_kubeconfig
    if not os.path.exists(kubeconfig):
        raise LabError(f"{kubeconfig} missing: is the lab in {state_dir} fully up?")
    return ClusterAccess(router_netns=state.router, kubeconfig=kubeconfig, kubectl=kubectl_binary())


def run_to_end(argv: Sequence[str]) -> int:
    """Run `argv` to its end. An interrupt (Ctrl-C reaches the suite too) lets it write its report."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            print("\nconformance: interrupted; waiting for the suite to write its report", file=sys.stderr)


def report_written_since(report_dir: str, started: float) -> str | None:
    path = os.path.join(report_dir, JUNIT_NAME)
    return path if os.path.exists(path) and os.path.getmtime(path) >= started else None


def list_selection(programs: Programs, selection: Selection, report_dir: str) -> tuple[list[str], int]:
    """(the selected specs, how many the binary has), from a dry run writing into `report_dir`."""
    started = time.time()
    proc = subprocess.run(dry_run_command(programs, selection, report_dir=report_dir), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True)
    report = report_written_since(report_dir, started)
    if proc.returncode != 0 or report is None:
        raise LabError(f"the dry run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    entries = read_report(report)
    return selected_specs(entries), sum(1 for entry in entries if entry.is_spec)


def print_summary(summary: Summary) -> None:
    for spec, why in summary.skips:
        print(f"SKIPPED {spec}: {why}")
    for spec in summary.failures:
        print(f"FAILED  {spec}")
    print(f"({summary.not_selected} specs of the binary not selected)")
    print(summary.closing_line)


def default_report_dir(suite: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return os.path.join(binaries.code_root(), "build", "conformance", f"{suite}-{stamp}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from lab.commands import DEFAULT_STATE_DIR
    parser = argparse.ArgumentParser(prog="scripts/conformance",
                                     description="The upstream sig-network e2e suite against the lab's Kubernetes.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=render_skip_table(SKIPS))
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="the lab's state (default %(default)s)")
    parser.add_argument("--suite", choices=tuple(SUITE_FOCUS), default="conformance",
                        help="conformance: sig-network [Conformance]; netpol: NetworkPolicy; all: sig-network")
    parser.add_argument("--focus", help="a ginkgo focus regexp replacing the suite's")
    parser.add_argument("--skip", help="a ginkgo skip regexp, added to the skip table")
    parser.add_argument("--report", help="the report directory (default build/conformance/<suite>-<time>)")
    parser.add_argument("--procs", type=int, default=DEFAULT_PROCS, help="parallel processes (default %(default)s)")
    parser.add_argument("--timeout", default=DEFAULT_TIMEOUT, help="the whole run's limit (default %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="list the specs that would run; no cluster needed")
    args = parser.parse_args(argv)
    if args.procs < 1:
        parser.error("--procs must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        programs = find_programs()
        selection = select(args.suite, focus=args.focus, extra_skip=args.skip)
        if args.dry_run:
            with tempfile.TemporaryDirectory(prefix="conformance-dry-run-") as scratch:
                specs, total = list_selection(programs, selection, args.report or scratch)
            print(render_skip_table(SKIPS))
            for spec in sorted(specs):
                print(spec.removeprefix(SPEC_PREFIX))
            print(f"{len(specs)} of {total} specs selected (suite {args.suite}, focus {selection.focus})")
            return 0
        if os.geteuid() != 0:
            raise LabError("a run enters the lab's router namespace: run it as root")
        cluster = cluster_access(args.state_dir)
        report_dir = os.path.abspath(args.report or default_report_dir(args.suite))
        selected, total = list_selection(programs, selection, os.path.join(report_dir, "selection"))
        if not selected:
            raise LabError(f"the selection is empty (focus {selection.focus!r}); nothing to run")
        print(f"conformance: {len(selected)} of {total} specs, {args.procs} process(es), report in {report_dir}")
        print(render_skip_table(SKIPS), flush=True)
        started = time.time()
        status = run_to_end(run_command(programs, selection, cluster=cluster, report_dir=report_dir,
                                        procs=args.procs, timeout=args.timeout))
    except LabError as exc:
        print(f"conformance: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    report = report_written_since(report_dir, started)
    summary = summarize(read_report(report), selected) if report else None
    if summary is None:
        print(f"conformance: the suite wrote no {JUNIT_NAME} in {report_dir} (exit {status})", file=sys.stderr)
    else:
        print_summary(summary)
        if status != 0 and summary.failed == 0:
            print(f"conformance: the suite exited {status} with no failed spec: see its output above", file=sys.stderr)
    return exit_code(summary, status)


if __name__ == "__main__":
    sys.exit(main())
