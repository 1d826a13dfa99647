"""`PodVethAttacher` and the tc attach/detach on the fakes of ebpf/fake_tc.py: which veths get
the tc path and when (start, notifications, a refusal retried by the runner), and `stop()`
closing the program descriptors only once no rescan can use them. The real kernel:
tests/netns/test_ebpf_pod_veths.py."""
from __future__ import annotations

import errno
import os
import threading

import pytest

from ebpf.fake_tc import FakeLinkWatch, FakeTcNetlink
from ebpf.pod_veths import RETRY_INTERVAL, PodVethAttacher
from ebpf.tc import EGRESS, INGRESS, attach_tc, attached_tc, detach_tc
from netagent.infra.fake_clock import FakeClock
from tests.cluster.lab_tools import wait_for

POD_A, POD_B = "na0123456789ab", "nafedcba987654"
ON_A_POD = {INGRESS: "na_tc_from_pod", EGRESS: "na_tc_egress"}


@pytest.fixture
def program_fds():
    pipes = [os.pipe() for _ in range(2)]
    fds = {"na_tc_from_pod": pipes[0][0], "na_tc_egress": pipes[1][0]}
    yield fds   # the read ends are the attacher's: every test has it close them
    for _, write_end in pipes:
        os.close(write_end)


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def attacher_on(kernel: FakeTcNetlink, fds, watch: FakeLinkWatch, clock: FakeClock) -> PodVethAttacher:
    return PodVethAttacher(dict(fds), netlink=kernel, watch=lambda: watch, clock=clock)


def test_pod_veths_get_the_tc_path_at_start_and_as_they_appear_and_nothing_else_does(program_fds):
    kernel, watch, clock = FakeTcNetlink(), FakeLinkWatch(), FakeClock()
    kernel.add_link(POD_A)
    kernel.add_link("na-other0")
    kernel.add_link("eth0")
    attacher = attacher_on(kernel, program_fds, watch, clock)
    attacher.start()
    try:
        assert kernel.programs_on(POD_A) == ON_A_POD   # done before start() returns
        assert kernel.programs_on("na-other0") == {} and kernel.programs_on("eth0") == {}
        kernel.add_link(POD_B)
        watch.notify(3)
        wait_for(lambda: kernel.programs_on(POD_B) == ON_A_POD, timeout=30, what="the new pod veth")
        kernel.remove_link(POD_B)
        kernel.add_link(POD_B)   # the same name again: a new device
        watch.notify()
        wait_for(lambda: kernel.programs_on(POD_B) == ON_A_POD, timeout=30, what="the new pod veth")
        assert sorted(attacher.attached.values()) == [POD_A, POD_B]
        assert attacher.runner.status().failures == 0
    finally:
        assert attacher.stop()
    assert watch.closed and attacher.fds == {}
    assert not any(is_open(fd) for fd in program_fds.values())


def test_a_refused_attach_fails_the_run_and_the_runner_retries_it(program_fds):
    kernel, watch, clock = FakeTcNetlink(), FakeLinkWatch(), FakeClock()
    kernel.add_link(POD_A)
    kernel.fail("replace_bpf_filter", OSError(errno.EBUSY, "busy"))
    attacher = attacher_on(kernel, program_fds, watch, clock)
    attacher.start()
    try:
        assert attacher.runner.wait_settled(30)
        status = attacher.runner.status()
        assert status.consecutive_failures == 1 and POD_A in (status.last_error or "")
        assert attacher.attached == {}
        clock.advance(RETRY_INTERVAL)
        assert attacher.runner.wait_settled(30)
        assert kernel.programs_on(POD_A) == ON_A_POD and attacher.runner.status().consecutive_failures == 0
    finally:
        attacher.stop()


def test_stop_never_closes_the_descriptors_under_a_running_rescan(program_fds):
    kernel, watch, clock = FakeTcNetlink(), FakeLinkWatch(), FakeClock()
    attacher = attacher_on(kernel, program_fds, watch, clock)
    attacher.start()
    entered, release = threading.Event(), threading.Event()
    links = kernel.links

    def held_links():
        entered.set()
        assert release.wait(30)
        return links()

    kernel.links = held_links   # type: ignore[method-assign]
    watch.notify()
    assert entered.wait(30)
    assert attacher.stop(timeout=0.05) is False   # the rescan holds on: descriptors stay open
    assert all(is_open(fd) for fd in program_fds.values())
    release.set()
    assert attacher.runner.stop(30)
    assert attacher.stop() is True and not any(is_open(fd) for fd in program_fds.values())


def test_attach_detach_and_list_through_the_seam():
    kernel = FakeTcNetlink()
    kernel.add_link("ext0")
    kernel.add_link("lo")
    attach_tc("ext0", {"na_tc_ingress": 7, "na_tc_egress": 8}, netlink=kernel)
    attach_tc("ext0", {"na_tc_ingress": 9, "na_tc_egress": 10}, netlink=kernel)   # replaced in place
    assert sorted(attached_tc(netlink=kernel)) == [("ext0", "na_tc_egress"), ("ext0", "na_tc_ingress")]
    with pytest.raises(LookupError):
        attach_tc("gone0", {"na_tc_ingress": 7, "na_tc_egress": 8}, netlink=kernel)
    assert sorted(detach_tc(netlink=kernel)) == ["tc filter na_tc_egress on ext0", "tc filter na_tc_ingress on ext0"]
    assert attached_tc(netlink=kernel) == [] and kernel.clsact == {1}   # the qdisc stays (maybe shared)
