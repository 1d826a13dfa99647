"""The eBPF agent keeps no compiler in its address space (issue 31): bcc and LLVM run in a
child process (ebpf/compiler.py) and only the programs' descriptors come back.

An "agent" here is a fresh Python process that builds the eBPF backend exactly as
`netagent run` does (proxy.factory.build_ebpf_backend: compile, load, attach to a test-made
cgroup, pins in a private bpffs) and syncs Services; the test reads its /proc/<pid>/maps
while it serves, and real connections from the cgroup reach the endpoints meanwhile. The
test's own process imported bcc (require_bcc): its maps are the proof that the check sees
LLVM where it is. The compiler's failures reach the caller as clear errors, with nothing
left loaded or pinned.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ebpf.compiler import CompileError, ProgramSpec, compile_and_load
from ebpf.loader import PROG_TYPE_SCHED_CLS, EbpfError, SocketLbLoader
from netagent.kernel.families import IpFamily
from tests.netns.ebpf_fixtures import bpf_root, compiler_mappings, require_bcc, run_in_cgroup, test_cgroup  # noqa: F401
from tests.netns.test_ebpf_socket_lb import ClientAndBackends, assert_balanced, client

ROOT = Path(__file__).resolve().parents[2]

AGENT = r"""
import json, sys
from proxy.ebpf.backend import EbpfPaths
from proxy.factory import build_ebpf_backend
from tests.netns.test_ebpf_socket_lb import service_state
backend = build_ebpf_backend(EbpfPaths(bpf_root=sys.argv[1], cgroup=sys.argv[2]))
backend.sync(service_state(), changed=None)
print(json.dumps({"bcc_imported": sorted(m for m in sys.modules if m == "bcc" or m.startswith("bcc.")),
                  "attached": len(backend.load_report.attached)}), flush=True)
sys.stdin.readline()   # serving until the test has looked
backend.cleanup()
"""


@pytest.fixture(autouse=True)
def _bcc():
    require_bcc()


def test_the_agent_maps_no_llvm_and_its_services_are_served(bpf_root, test_cgroup):  # noqa: F811
    assert compiler_mappings("self"), "the check would see LLVM: this process imported bcc"
    with ClientAndBackends() as topology:
        agent = subprocess.Popen([sys.executable, "-c", AGENT, bpf_root, test_cgroup], cwd=ROOT,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = agent.stdout.readline()
            assert line, agent.communicate(timeout=60)[1]
            report = json.loads(line)
            assert report == {"bcc_imported": [], "attached": 8}
            assert compiler_mappings(agent.pid) == set()
            result = run_in_cgroup(test_cgroup, topology.names["cli"], client(IpFamily.V4))
            assert result.returncode == 0, result.stderr
            assert_balanced(json.loads(result.stdout), IpFamily.V4)   # real packets, both endpoints
            _, errors = agent.communicate("\n", timeout=120)
            assert agent.returncode == 0, errors
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()


def test_a_program_the_source_lacks_is_a_load_error_naming_it():
    with pytest.raises(CompileError) as caught:
        compile_and_load("int na_here(struct __sk_buff *skb) { return 0; }",
                         [ProgramSpec("na_here", PROG_TYPE_SCHED_CLS), ProgramSpec("na_missing", PROG_TYPE_SCHED_CLS)])
    assert caught.value.stage == "load" and caught.value.program == "na_missing"


def test_descriptors_come_back_alive_after_the_compiler_exits():
    from ebpf import syscall
    fds = compile_and_load("int na_alive(struct __sk_buff *skb) { return 7; }",
                           [ProgramSpec("na_alive", PROG_TYPE_SCHED_CLS)])
    try:
        assert syscall.prog_info(fds["na_alive"]).name == "na_alive"
        assert syscall.prog_test_run(fds["na_alive"], bytes(64))[0] == 7   # the kernel runs it
    finally:
        os.close(fds["na_alive"])


def test_a_source_that_does_not_compile_is_a_clear_error_and_the_pinned_maps_stay(bpf_root, test_cgroup):  # noqa: F811
    loader = SocketLbLoader(bpf_root=bpf_root, cgroup=test_cgroup)
    loader.ensure_loaded()
    pinned = sorted(os.listdir(loader.pin_dir))

    class Broken(SocketLbLoader):
        def source(self) -> str:
            return super().source() + "\nint na_broken(void) { return undeclared_name; }\n"

    broken = Broken(bpf_root=bpf_root, cgroup=test_cgroup)
    with pytest.raises(EbpfError, match=r"(?s)^compiling sock_lb\.c: .*undeclared_name"):
        broken.ensure_loaded()
    assert sorted(os.listdir(loader.pin_dir)) == pinned
