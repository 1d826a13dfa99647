"""The Python views of the eBPF maps: packers agree with the ctypes structures, encoders
round-trip through the decoders, and the fake map set refuses what the kernel refuses.
(tests/netns/test_ebpf_socket_lb.py checks the ctypes structures against bcc's view of the C.)"""
import ctypes
import errno

import pytest

from ebpf import maps as M
from ebpf.fake_maps import FakeBpfMap, fake_map_set, writes


@pytest.mark.parametrize("layout", M.LAYOUTS.values(), ids=lambda layout: layout.name)
def test_packers_have_the_sizes_of_the_ctypes_views(layout):
    assert layout.key_packer.size == ctypes.sizeof(layout.key)
    assert layout.value_packer.size == ctypes.sizeof(layout.value)


def test_service_entry_round_trips_and_keeps_network_byte_order():
    key = M.svc_key("10.96.0.10", 53, "UDP")
    value = M.svc_value(set_id=7, count=3, ext_set_id=8, ext_count=1, affinity_timeout=60,
                        flags=M.F_EXTERNAL_LOCAL, kind=M.AddressKind.NODE_PORT)
    view = M.SvcKey.from_buffer_copy(key)
    assert bytes(view)[:4] == bytes([10, 96, 0, 10]) and bytes(view)[4:6] == (53).to_bytes(2, "big")
    assert view.proto == 17
    entry = M.parse_svc(key, value)
    assert (entry.address, entry.port, entry.protocol) == ("10.96.0.10", 53, "UDP")
    assert (entry.set_id, entry.count, entry.ext_set_id, entry.ext_count) == (7, 3, 8, 1)
    assert entry.kind is M.AddressKind.NODE_PORT and entry.affinity_timeout == 60
    assert M.SvcValue.from_buffer_copy(value).ext_set_id == 8


def test_backend_and_set_name_round_trip():
    assert M.parse_backend(M.backend("10.244.1.5", 8080)) == "10.244.1.5:8080"
    assert M.parse_slot_key(M.slot_key(4, 2)) == (4, 2)
    assert M.parse_set_name(M.set_name("default/dns:dns-udp", M.SetRole.EXTERNAL)) == \
        ("default/dns:dns-udp", M.SetRole.EXTERNAL)
    long_name = "n" * 300
    assert len(M.parse_set_name(M.set_name(long_name, M.SetRole.CLUSTER))[0]) == M.NAME_BYTES - 1


def test_fake_map_refuses_wrong_sizes_and_a_full_map_and_counts_writes():
    maps = fake_map_set(max_entries=2)
    with pytest.raises(OSError) as wrong:
        maps.slots.update({b"\0" * 3: M.backend("10.0.0.1", 1)})
    assert wrong.value.errno == errno.EINVAL
    maps.slots.update({M.slot_key(1, 0): M.backend("10.0.0.1", 1), M.slot_key(1, 1): M.backend("10.0.0.2", 1)})
    with pytest.raises(OSError) as full:
        maps.slots.update({M.slot_key(1, 2): M.backend("10.0.0.3", 1)})
    assert full.value.errno == errno.E2BIG and maps.slots.count() == 2
    maps.slots.delete([M.slot_key(1, 0), M.slot_key(9, 9)])   # a missing key is not an error
    assert maps.slots.count() == 1 and writes(maps) == 3
    assert isinstance(maps.svc, FakeBpfMap) and maps.svc.lookup(M.svc_key("10.0.0.1", 1, "TCP")) is None


def test_backend_flags_are_native_and_the_port_network_order():
    view = M.Backend.from_buffer_copy(M.backend("10.0.0.1", 8080, local=True))
    assert view.flags == M.BACKEND_LOCAL and bytes(view)[4:6] == (8080).to_bytes(2, "big")
