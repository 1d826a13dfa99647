"""A pinned map left by an earlier version with another entry layout (here `na_ct` before it
kept sequence numbers: 24-byte values, now 32) is recreated by the loader at today's layout,
empty, and reported, rather than reused with the wrong sizes (bcc would hand the programs the
old map). Real kernel, private bpffs, a test-made cgroup."""
import os

import pytest

from ebpf import maps as M
from ebpf import syscall
from ebpf.loader import SocketLbLoader
from ebpf.sizes import DEFAULT_SIZES
from tests.netns.ebpf_fixtures import bpf_root, require_bcc, test_cgroup  # noqa: F401

OLD_CT = """
struct old_key { __u32 saddr; __u32 daddr; __u16 sport; __u16 dport; __u8 proto; __u8 dir; __u16 pad; };
struct old_value { __u32 saddr; __u32 daddr; __u16 sport; __u16 dport; __u32 flags; __u64 created_ns; };
BPF_TABLE_PINNED("lru_hash", struct old_key, struct old_value, na_ct, %d, "%s/na_ct");
int na_old(void *ctx) { return 0; }
"""


@pytest.fixture(autouse=True)
def _bcc():
    require_bcc()


def test_a_pinned_ct_map_of_the_old_layout_is_recreated_at_the_new_one(bpf_root, test_cgroup):  # noqa: F811
    from bcc import BPF
    loader = SocketLbLoader(bpf_root=bpf_root, cgroup=test_cgroup)
    os.makedirs(loader.pin_dir)
    old = BPF(text=(OLD_CT % (DEFAULT_SIZES[M.CT_MAP], loader.pin_dir)).encode())
    old.cleanup()
    path = os.path.join(loader.pin_dir, M.CT_MAP)
    fd = syscall.obj_get(path)
    assert syscall.map_info(fd).value_size == 24
    os.close(fd)
    report = loader.ensure_loaded()
    assert any(line.startswith(f"{M.CT_MAP}: its entries' layout changed") for line in report.resized), report.resized
    fd = syscall.obj_get(path)
    try:
        info = syscall.map_info(fd)
        assert (info.key_size, info.value_size) == (M.LAYOUTS[M.CT_MAP].key_size, M.LAYOUTS[M.CT_MAP].value_size) \
            == (16, 32)
    finally:
        os.close(fd)
    again = loader.ensure_loaded()   # now at today's layout: nothing recreated, programs kept
    assert again.resized == () and again.attached == ()
