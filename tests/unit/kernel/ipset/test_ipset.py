"""The ipset layer without root: member spelling, FakeIpset's rules, sync_set and the header
parser. Each spelling and refusal was first observed with the real ipset 7.17 in a test
namespace; tests/netns/test_ipset_runner.py replays them against the real tool and the fake
side by side."""
import pytest

from netagent.kernel.ipset import (
    FakeIpset,
    IpsetError,
    IpsetNotInstalled,
    IpsetRunner,
    IpsetSpec,
    IpsetType,
    IpsetWrite,
    canonical_member,
    create_arguments,
    delete_owned_sets,
    entry,
    iptables_references,
    parse_header,
    parse_save,
    sync_set,
    sync_sets,
)
from netagent.kernel.ipset.restore import restore_lines
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.tokens import UnsafeText, ipset_token, split_ipset_line
from proxy.model import Protocol

HASH = IpsetSpec("NETAGENT-T-HASH", IpsetType.HASH_IP_PORT_IP)


@pytest.mark.parametrize("set_type, text, canonical", [
    (IpsetType.HASH_IP, "10.0.0.1", "10.0.0.1"),
    (IpsetType.HASH_IP, "10.0.0.1/32", "10.0.0.1"),
    (IpsetType.HASH_NET, "10.1.2.3/16", "10.1.0.0/16"),
    (IpsetType.HASH_NET, "10.1.2.3/32", "10.1.2.3"),
    (IpsetType.HASH_IP_PORT, "10.0.0.1,80", "10.0.0.1,tcp:80"),
    (IpsetType.HASH_IP_PORT, "10.0.0.1,UDP:53", "10.0.0.1,udp:53"),
    (IpsetType.HASH_IP_PORT_IP, "10.0.0.1,sctp:9,10.0.0.2", "10.0.0.1,sctp:9,10.0.0.2"),
    (IpsetType.HASH_IP_PORT_NET, "10.0.0.1,tcp:80,192.168.1.7/24", "10.0.0.1,tcp:80,192.168.1.0/24"),
    (IpsetType.HASH_IP_PORT_NET, "10.0.0.1,tcp:80,192.168.1.7", "10.0.0.1,tcp:80,192.168.1.7"),
    (IpsetType.BITMAP_PORT, "30080", "30080"),
    (IpsetType.BITMAP_PORT, "udp:53", "53"),
    # IPv6 (family inet6 sets), as `ipset save` 7.17 printed them here
    (IpsetType.HASH_IP, "fd00:0::5/128", "fd00::5"),
    (IpsetType.HASH_NET, "fd00:0:0::0/64", "fd00::/64"),
    (IpsetType.HASH_NET, "fd00::5/128", "fd00::5"),
    (IpsetType.HASH_IP_PORT, "fd00::0:1,tcp:80", "fd00::1,tcp:80"),
])
def test_canonical_member_is_what_ipset_save_prints(set_type, text, canonical):
    assert canonical_member(set_type, text) == canonical


@pytest.mark.parametrize("set_type, text", [
    (IpsetType.HASH_IP, "10.0.0.0/30"),          # the tool would add four members
    (IpsetType.HASH_IP, "010.0.0.9"),            # the tool reads octal
    (IpsetType.HASH_IP, "::1::2"),
    (IpsetType.HASH_IP, "::g1"),
    (IpsetType.HASH_NET, "fd00::/0"),
    (IpsetType.HASH_NET, "fd00::/129"),
    (IpsetType.HASH_IP, "node-1"),               # the tool would resolve it
    (IpsetType.HASH_NET, "0.0.0.0/0"),
    (IpsetType.HASH_NET, "10.0.0.0/33"),
    (IpsetType.HASH_IP_PORT, "10.0.0.1,tcp:65536"),
    (IpsetType.HASH_IP_PORT, "10.0.0.1,tcp:8-9"),
    (IpsetType.HASH_IP_PORT, "10.0.0.1,icmp:8"),
    (IpsetType.HASH_IP_PORT, "10.0.0.1,udp:http"),
    (IpsetType.HASH_IP_PORT, "10.0.0.1"),
    (IpsetType.HASH_IP_PORT_IP, "10.0.0.1,tcp:80"),
    (IpsetType.BITMAP_PORT, "icmp:1"),
])
def test_canonical_member_refuses_what_the_set_cannot_hold_as_one_member(set_type, text):
    with pytest.raises(IpsetError):
        canonical_member(set_type, text)


def test_entry_spelling():
    assert entry("10.0.0.1", Protocol.TCP, 80) == "10.0.0.1,tcp:80"
    assert entry("10.0.0.1", "UDP", 53, extra_ip="10.0.0.1") == "10.0.0.1,udp:53,10.0.0.1"
    assert entry("10.0.0.1", Protocol.SCTP, 9, extra_ip="10.9.9.9/8") == "10.0.0.1,sctp:9,10.0.0.0/8"
    with pytest.raises(IpsetError):
        entry("10.0.0.1", "icmp", 0)


@pytest.mark.parametrize("name", ["KUBE-SVC", "NETAGENT-" + "X" * 23, "NETAGENT-A B"])
def test_spec_names_must_be_ours_and_short(name):
    with pytest.raises(ValueError):
        IpsetSpec(name, IpsetType.HASH_IP)


def test_ensure_set_creates_once_and_update_adds_and_removes():
    ipset = FakeIpset()
    ipset.ensure_set(HASH)
    ipset.ensure_set(HASH)
    assert ipset.writes == [IpsetWrite("create", HASH.name)]
    ipset.update(HASH.name, add=["10.0.0.1,80,10.0.0.1", "10.0.0.2,udp:53,10.0.0.2"])
    ipset.update(HASH.name, add=["10.0.0.3,tcp:80,10.0.0.3"], remove=["10.0.0.1,tcp:80,10.0.0.1", "10.9.9.9,tcp:1,10.9.9.9"])
    assert ipset.members(HASH.name) == {"10.0.0.2,udp:53,10.0.0.2", "10.0.0.3,tcp:80,10.0.0.3"}
    assert ipset.describe(HASH.name).entries == 2


def test_update_with_a_bad_member_writes_nothing():
    ipset = FakeIpset()
    ipset.ensure_set(HASH)
    before = list(ipset.writes)
    with pytest.raises(IpsetError, match="bogus"):
        ipset.update(HASH.name, add=["10.0.0.1,tcp:80,10.0.0.1", "bogus,tcp:1,10.0.0.1"])
    assert ipset.members(HASH.name) == frozenset() and ipset.writes == before


def test_update_refuses_a_member_both_added_and_removed_and_a_missing_set():
    ipset = FakeIpset()
    ipset.ensure_set(HASH)
    with pytest.raises(IpsetError, match="both"):
        ipset.update(HASH.name, add=["10.0.0.1,80,10.0.0.1"], remove=["10.0.0.1,tcp:80,10.0.0.1"])
    with pytest.raises(IpsetError, match="does not exist"):
        ipset.update("NETAGENT-T-NONE", add=["10.0.0.1"])
    with pytest.raises(IpsetError, match="does not exist"):
        ipset.members("NETAGENT-T-NONE")


def test_update_with_nothing_is_not_a_write():
    ipset = FakeIpset()
    ipset.update("NETAGENT-T-NONE")
    assert ipset.writes == []


def test_a_full_set_stops_where_the_kernel_stops():
    spec = IpsetSpec("NETAGENT-T-SMALL", IpsetType.HASH_IP, max_elements=2)
    ipset = FakeIpset()
    ipset.ensure_set(spec)
    with pytest.raises(IpsetError, match="full"):
        ipset.update(spec.name, add=["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    assert ipset.members(spec.name) == {"10.0.0.1", "10.0.0.2"}
    ipset.update(spec.name, add=["10.0.0.3"], remove=["10.0.0.1"])
    assert ipset.members(spec.name) == {"10.0.0.2", "10.0.0.3"}


def test_destroy_in_use_refused_absent_quiet_and_only_ours():
    ipset = FakeIpset()
    ipset.ensure_set(HASH)
    ipset.reference(HASH.name)
    with pytest.raises(IpsetError, match="in use"):
        ipset.destroy(HASH.name)
    ipset.release(HASH.name)
    ipset.destroy(HASH.name)
    ipset.destroy(HASH.name)
    assert ipset.list_names() == []
    with pytest.raises(ValueError):
        ipset.destroy("KUBE-CLUSTER-IP")


def test_wrong_type_is_recreated_when_unused_and_refused_when_used():
    ipset = FakeIpset()
    ipset.ensure_set(IpsetSpec(HASH.name, IpsetType.HASH_IP))
    ipset.update(HASH.name, add=["10.0.0.1"])
    ipset.ensure_set(HASH)
    assert ipset.describe(HASH.name).type is IpsetType.HASH_IP_PORT_IP
    assert ipset.members(HASH.name) == frozenset()
    ipset.reference(HASH.name)
    with pytest.raises(IpsetError, match="in use"):
        ipset.ensure_set(IpsetSpec(HASH.name, IpsetType.HASH_NET))
    assert ipset.describe(HASH.name).type is IpsetType.HASH_IP_PORT_IP


def test_sync_set_diffs_and_is_silent_when_in_agreement():
    ipset = FakeIpset()
    assert sync_set(ipset, HASH, ["10.0.0.1,80,10.0.0.1", "10.0.0.2,tcp:80,10.0.0.2"]) == (2, 0)
    writes = len(ipset.writes)
    assert sync_set(ipset, HASH, ["10.0.0.2,TCP:80,10.0.0.2", "10.0.0.1,tcp:80,10.0.0.1"]) == (0, 0)
    assert len(ipset.writes) == writes
    assert sync_set(ipset, HASH, ["10.0.0.2,tcp:80,10.0.0.2", "10.0.0.3,udp:53,10.0.0.3"]) == (1, 1)
    assert ipset.members(HASH.name) == {"10.0.0.2,tcp:80,10.0.0.2", "10.0.0.3,udp:53,10.0.0.3"}
    assert ipset.writes[-1] == IpsetWrite("update", HASH.name, ("10.0.0.3,udp:53,10.0.0.3",),
                                          ("10.0.0.1,tcp:80,10.0.0.1",))


def test_sync_set_rejects_a_bad_desired_member_before_touching_anything():
    ipset = FakeIpset()
    with pytest.raises(IpsetError):
        sync_set(ipset, HASH, ["10.0.0.1,tcp:80"])
    assert ipset.writes == []


def test_iptables_references_make_a_set_busy():
    iptables = FakeIptables()
    ipset = FakeIpset(in_use=iptables_references(iptables))
    ipset.ensure_set(HASH)
    ipset.ensure_set(IpsetSpec("NETAGENT-T-OTHER", IpsetType.HASH_IP))
    iptables.restore("*filter\n:NETAGENT-T - [0:0]\n"
                     f"-A NETAGENT-T -m set --match-set {HASH.name} dst,dst,src -j ACCEPT\nCOMMIT\n")
    assert ipset.describe(HASH.name).references == 1
    with pytest.raises(IpsetError, match="in use"):
        delete_owned_sets(ipset)
    assert ipset.list_names() == [HASH.name]
    iptables.delete_owned()
    assert delete_owned_sets(ipset) == [HASH.name]


def test_owned_names_select_only_ours():
    ipset = FakeIpset()
    ipset.ensure_set(HASH)
    ipset.sets["KUBE-CLUSTER-IP"] = ipset.sets[HASH.name]
    assert ipset.owned_names() == [HASH.name]
    assert ipset.owned_names(prefix="NETAGENT-T-H") == [HASH.name]
    with pytest.raises(ValueError):
        ipset.owned_names(prefix="")


def test_parse_header_and_create_arguments():
    info = parse_header("Name: NETAGENT-A\nType: hash:ip,port,ip\nRevision: 6\n"
                        "Header: family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1\n"
                        "Size in memory: 466\nReferences: 1\nNumber of entries: 3\n")
    assert (info.name, info.type, info.family, info.references, info.entries, info.max_elements) == \
        ("NETAGENT-A", IpsetType.HASH_IP_PORT_IP, "inet", 1, 3, 65536)
    bitmap = parse_header("Name: NETAGENT-B\nType: bitmap:port\nRevision: 3\nHeader: range 0-65535\n"
                          "Size in memory: 8264\nReferences: 0\nNumber of entries: 1\n")
    assert (bitmap.type, bitmap.family, bitmap.max_elements) == (IpsetType.BITMAP_PORT, None, None)
    assert parse_header("Name: X\nType: list:set\nHeader: size 8\nReferences: 0\n").type == "list:set"
    with pytest.raises(IpsetError):
        parse_header("garbage")
    assert create_arguments(IpsetSpec("NETAGENT-B", IpsetType.BITMAP_PORT)) == \
        ["NETAGENT-B", "bitmap:port", "range", "0-65535"]
    assert create_arguments(IpsetSpec("NETAGENT-A", IpsetType.HASH_NET, max_elements=10)) == \
        ["NETAGENT-A", "hash:net", "family", "inet", "maxelem", "10"]
    assert create_arguments(IpsetSpec("NETAGENT-A6", IpsetType.HASH_NET, max_elements=10, family="inet6")) == \
        ["NETAGENT-A6", "hash:net", "family", "inet6", "maxelem", "10"]
    with pytest.raises(ValueError):
        IpsetSpec("NETAGENT-A6", IpsetType.HASH_NET, family="inet7")


def test_fake_holds_an_inet6_set_and_refuses_the_other_family_as_the_kernel_does():
    ipset = FakeIpset()
    spec = IpsetSpec("NETAGENT-V6", IpsetType.HASH_IP_PORT, family="inet6")
    sync_sets(ipset, {spec: {"fd00::1,tcp:80"}})
    assert ipset.describe(spec.name).family == "inet6"
    assert ipset.snapshot()[spec.name].members == {"fd00::1,tcp:80"}
    assert sync_sets(ipset, {spec: {"fd00::1,tcp:80"}}) == {spec.name: (0, 0)}    # read back as written
    with pytest.raises(IpsetError, match="family"):
        ipset.update(spec.name, add=["10.0.0.1,tcp:80"])
    v4 = IpsetSpec("NETAGENT-V6", IpsetType.HASH_IP_PORT)            # same name, other family: recreated
    sync_sets(ipset, {v4: {"10.0.0.1,tcp:80"}})
    assert ipset.describe(v4.name).family == "inet"


def test_runner_reports_a_missing_binary():
    with pytest.raises(IpsetNotInstalled, match="not installed"):
        IpsetRunner(binary="/nonexistent/ipset").list_names()


def test_sync_sets_creates_and_diffs_in_one_write():
    ipset = FakeIpset()
    other = IpsetSpec("NETAGENT-T-NET", IpsetType.HASH_NET)
    sync_set(ipset, other, ["10.1.0.0/16"])
    writes = len(ipset.writes)
    counts = sync_sets(ipset, {HASH: ["10.0.0.1,80,10.0.0.1"], other: ["10.2.0.0/16"]})
    assert counts == {HASH.name: (1, 0), other.name: (1, 1)}
    assert ipset.writes[writes:] == [IpsetWrite("create", HASH.name),
                                     IpsetWrite("update", HASH.name, ("10.0.0.1,tcp:80,10.0.0.1",), ()),
                                     IpsetWrite("update", other.name, ("10.2.0.0/16",), ("10.1.0.0/16",))]
    writes = len(ipset.writes)
    assert sync_sets(ipset, {HASH: ["10.0.0.1,tcp:80,10.0.0.1"], other: ["10.2.0.0/16"]}) == {
        HASH.name: (0, 0), other.name: (0, 0)}
    assert len(ipset.writes) == writes


def test_sync_sets_recreates_a_wrong_type_only_when_unused():
    ipset = FakeIpset()
    sync_set(ipset, IpsetSpec(HASH.name, IpsetType.HASH_IP), ["10.0.0.1"])
    assert sync_sets(ipset, {HASH: ["10.0.0.1,tcp:80,10.0.0.1"]}) == {HASH.name: (1, 0)}
    assert ipset.describe(HASH.name).type is IpsetType.HASH_IP_PORT_IP
    ipset.reference(HASH.name)
    with pytest.raises(IpsetError, match="in use"):
        sync_sets(ipset, {IpsetSpec(HASH.name, IpsetType.HASH_IP): []})


def test_update_many_validates_everything_first():
    ipset = FakeIpset()
    other = IpsetSpec("NETAGENT-T-NET", IpsetType.HASH_NET)
    sync_sets(ipset, {HASH: [], other: []})
    writes = len(ipset.writes)
    with pytest.raises(IpsetError):
        ipset.update_many({HASH.name: (["10.0.0.1,tcp:80,10.0.0.1"], []), other.name: (["nonsense"], [])})
    assert len(ipset.writes) == writes
    ipset.update_many({HASH.name: (["10.0.0.1,80,10.0.0.1"], []), other.name: (["10.9.0.0/16"], []),
                       "NETAGENT-T-UNTOUCHED": ([], [])}, types={other.name: IpsetType.HASH_NET})
    assert ipset.members(HASH.name) == {"10.0.0.1,tcp:80,10.0.0.1"} and ipset.members(other.name) == {"10.9.0.0/16"}


def test_parse_save_reads_every_set():
    text = ("create NETAGENT-A hash:ip,port,ip family inet hashsize 1024 maxelem 65536 comment bucketsize 12\n"
            "add NETAGENT-A 10.0.0.2,udp:53,10.0.0.2 comment \"x\"\n"
            "create NETAGENT-B bitmap:port range 0-65535\nadd NETAGENT-B 30080\n"
            "create NETAGENT-E hash:net family inet hashsize 1024 maxelem 65536\n"
            "create X list:set size 8\n")
    sets = parse_save(text)
    assert sets["NETAGENT-A"].members == {"10.0.0.2,udp:53,10.0.0.2"} and sets["NETAGENT-A"].family == "inet"
    assert (sets["NETAGENT-B"].type, sets["NETAGENT-B"].family, sets["NETAGENT-B"].members) == \
        (IpsetType.BITMAP_PORT, None, {"30080"})
    assert sets["NETAGENT-E"].members == frozenset() and sets["X"].type == "list:set"


# ---- the restore text: every token through ipset_token ----------------------------------------


@pytest.mark.parametrize("line, tokens", [      # as ipset 7.17 reads them (measured in a namespace)
    ("create NETAGENT-A hash:ip family inet", ["create", "NETAGENT-A", "hash:ip", "family", "inet"]),
    ('create "NETAGENT-A" hash:ip', ["create", "NETAGENT-A", "hash:ip"]),
    ('add S 10.0.0.1 comment a"b c"d', ["add", "S", "10.0.0.1", "comment", "ab cd"]),
    ("create NETAGENT-A\thash:ip family inet\r", ["create", "NETAGENT-A", "hash:ip", "family", "inet"]),
    ("create NETAGENT-A hash:ip\x00garbage", ["create", "NETAGENT-A", "hash:ip"]),
    ("  # a comment", None), ("# a comment", None), ("", None),
])
def test_split_ipset_line_reads_like_ipset_restore(line, tokens):
    assert split_ipset_line(line) == tokens


def test_split_ipset_line_refuses_an_open_quote():
    with pytest.raises(ValueError):
        split_ipset_line('add S 10.0.0.1 comment "a b')


@pytest.mark.parametrize("token", ["NETAGENT-A", "10.0.0.1,tcp:80,10.0.0.1", "10.1.0.0/16", "hash:ip,port", "65535"])
def test_ipset_token_admits_names_and_members(token):
    assert ipset_token(token) == token


@pytest.mark.parametrize("token", ["", "a b", 'a"b', "a\nadd", "a\rb", "#x", "-exist", "a\\b", "é", "a\x00"])
def test_ipset_token_refuses_what_could_change_the_line(token):
    with pytest.raises(UnsafeText):
        ipset_token(token)


def test_restore_lines_refuse_an_unsafe_member_rather_than_write_it():
    lines = restore_lines(create=[HASH], changes={HASH.name: (["10.0.0.1,tcp:80,10.0.0.1"], [])})
    assert [split_ipset_line(line) for line in lines] == [
        ["create", HASH.name, "hash:ip,port,ip", "family", "inet", "maxelem", str(HASH.max_elements)],
        ["add", HASH.name, "10.0.0.1,tcp:80,10.0.0.1"]]
    with pytest.raises(UnsafeText):
        restore_lines(create=[], changes={HASH.name: (["10.0.0.1\nflush"], [])})
    with pytest.raises(UnsafeText):
        restore_lines(create=[], changes={"NETAGENT-X Y": (["10.0.0.1"], [])})
