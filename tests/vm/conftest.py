"""Host-side fixtures of the VM tier: one guest boot per pytest session for all guest tests.

Booting Debian's kernel under TCG costs about 5 s and every Python start in the guest 1-3 s,
so the tier is shaped around a single boot that runs the whole guest folder (tests/vm/guest/)
in one pytest process. The guest writes a junit report into the run's read-write share; the
host parses it once and each host test asserts on its part (`GuestSuite.cases_of(module)`).
Host tests that need something else in the guest call `vm.run(argv)`, which boots a fresh guest.

The session fixture `vm` skips, with `missing_reason()`, only when the tools are missing
(qemu, linux-image-amd64, busybox-static). A guest that boots but fails is a test failure.
"""
from __future__ import annotations

import dataclasses
import enum
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from tests.vm import qemu

GUEST_DIR = Path(__file__).resolve().parent / "guest"
GUEST_REPORT = "guest-junit.xml"
# Preloaded for the guest suite: IPIP (issue 3) and ip6tnl, its IPv6 form (issue 22), and IPVS with its
# schedulers (issue 4).
GUEST_SUITE_MODULES = ("ipip", "ip6_tunnel", "veth", "dummy", "nf_conntrack", "br_netfilter", "ip_vs", "ip_vs_rr",
                       "ip_vs_wrr", "ip_vs_sh")
# seconds: IPIP, IPVS backend and IPVS lab tests under TCG take about 5 minutes on an idle machine;
# TCG is CPU-bound, so a loaded 2-core machine stretches that: this only stops a guest that hangs
GUEST_SUITE_TIMEOUT = 1800


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.vm)


class Outcome(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"


@dataclasses.dataclass(frozen=True)
class GuestCase:
    classname: str
    name: str
    outcome: Outcome
    detail: str


@dataclasses.dataclass(frozen=True)
class GuestSuite:
    """What one guest pytest run reported, per test case, with the run itself for diagnostics."""
    result: qemu.VmResult
    cases: tuple[GuestCase, ...]

    def cases_of(self, module: Path) -> list[GuestCase]:
        dotted = ".".join(module.resolve().relative_to(qemu.PROJECT_DIR).with_suffix("").parts)
        return [c for c in self.cases
                if c.classname == dotted or c.classname.startswith(dotted + ".")
                or (not c.classname and c.name == dotted)]


def parse_junit(xml_text: str) -> tuple[GuestCase, ...]:
    cases = []
    for case in ElementTree.fromstring(xml_text).iter("testcase"):
        outcome, detail = Outcome.PASSED, ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = Outcome(child.tag if child.tag != "failure" else "failed")
                detail = "\n".join(filter(None, (child.get("message", ""), child.text or "")))
                break
        cases.append(GuestCase(classname=case.get("classname", ""), name=case.get("name", ""),
                               outcome=outcome, detail=detail))
    return tuple(cases)


class VmTier:
    """The session's handle on the VM tier: ad-hoc guest runs and the once-per-session suite."""

    def __init__(self, share_root: Path):
        self.kernel = qemu.find_guest_kernel()
        self._share_root = share_root
        self._suite: GuestSuite | None = None
        self._suite_error: BaseException | None = None

    def run(self, argv: list[str], **kwargs) -> qemu.VmResult:
        return qemu.run_in_vm(argv, **kwargs)

    def guest_suite(self) -> GuestSuite:
        """Run tests/vm/guest in one guest boot (first call only); later calls reuse the report."""
        if self._suite is None and self._suite_error is None:
            try:
                self._suite = self._run_suite()
            except Exception as error:  # remembered so every dependent test reports the cause
                self._suite_error = error
        if self._suite_error is not None:
            raise self._suite_error
        return self._suite

    def _run_suite(self) -> GuestSuite:
        share = self._share_root / "guest-suite"
        report = share / GUEST_REPORT
        argv = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
                f"--junitxml={qemu.GUEST_SHARE}/{GUEST_REPORT}",
                str(GUEST_DIR.relative_to(qemu.PROJECT_DIR))]
        result = qemu.run_in_vm(argv, modules=GUEST_SUITE_MODULES, timeout=GUEST_SUITE_TIMEOUT,
                                share_dir=share)
        if not report.exists():
            raise qemu.VmFailure(f"the guest pytest run (exit {result.returncode}) wrote no report",
                                 output=result.output, console=result.console)
        return GuestSuite(result=result, cases=parse_junit(report.read_text()))


@pytest.fixture(scope="session")
def vm(tmp_path_factory) -> VmTier:
    reason = qemu.missing_reason()
    if reason:
        pytest.skip(f"VM tier unavailable: {reason}")
    return VmTier(tmp_path_factory.mktemp("vm"))
