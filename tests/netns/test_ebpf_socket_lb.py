"""The socket load balancer on the real kernel: compiled by bcc, maps pinned in a private bpffs,
programs attached to a test-made cgroup; real sockets in a test-made network namespace."""
import ctypes

import pytest

from ebpf import maps as M
from tests.netns.ebpf_fixtures import bpf_root, require_bcc, test_cgroup  # noqa: F401


@pytest.fixture(autouse=True)
def _bcc():
    require_bcc()


def test_python_views_match_the_c_structs_as_bcc_compiles_them(bpf_root, test_cgroup):  # noqa: F811
    from bcc import BPF

    from ebpf.loader import SocketLbLoader
    loader = SocketLbLoader(bpf_root=bpf_root, cgroup=test_cgroup)
    import os
    os.makedirs(loader.pin_dir)
    compiled = BPF(text=loader.source().encode())
    try:
        for name, layout in M.LAYOUTS.items():
            table = compiled[name.encode()]
            for ours, theirs in ((layout.key, table.Key), (layout.value, table.Leaf)):
                assert ctypes.sizeof(ours) == ctypes.sizeof(theirs), name
                if hasattr(theirs, "_fields_"):
                    assert [f[0] for f in ours._fields_] == [f[0] for f in theirs._fields_], name
                    for field, *_ in theirs._fields_:
                        assert getattr(ours, field).offset == getattr(theirs, field).offset, (name, field)
                        assert getattr(ours, field).size == getattr(theirs, field).size, (name, field)
    finally:
        compiled.cleanup()
