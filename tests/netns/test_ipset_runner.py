"""IpsetRunner against the real ipset inside a throwaway namespace (ipsets are per network
namespace), and FakeIpset beside it: after every step both hold the same sets and members and
fail the same way. The set is put in use by a real iptables rule in the namespace."""
import subprocess

import pytest

from netagent.kernel import namespaces
from netagent.kernel.ipset import (
    FakeIpset,
    IpsetError,
    IpsetRunner,
    IpsetSpec,
    IpsetType,
    delete_owned_sets,
    sync_set,
    sync_sets,
)
from netagent.kernel.iptables.tokens import split_ipset_line


@pytest.fixture
def runner(netns):
    return IpsetRunner(exec_prefix=namespaces.exec_prefix(netns), timeout=30)


def state(ipset):
    return {name: (ipset.describe(name).type, ipset.members(name)) for name in sorted(ipset.list_names())}


def both(real, fake, step):
    """Run `step` on both; they must both succeed or both raise IpsetError."""
    outcomes = []
    for ipset in (real, fake):
        try:
            outcomes.append(("ok", step(ipset)))
        except IpsetError as error:
            outcomes.append(("error", type(error)))
    assert outcomes[0] == outcomes[1], outcomes
    assert state(real) == state(fake)
    return outcomes[0]


SETS = [IpsetSpec("NETAGENT-T-IPI", IpsetType.HASH_IP_PORT_IP),
        IpsetSpec("NETAGENT-T-IPP", IpsetType.HASH_IP_PORT),
        IpsetSpec("NETAGENT-T-IPN", IpsetType.HASH_IP_PORT_NET),
        IpsetSpec("NETAGENT-T-NET", IpsetType.HASH_NET),
        IpsetSpec("NETAGENT-T-IP", IpsetType.HASH_IP),
        IpsetSpec("NETAGENT-T-PORT", IpsetType.BITMAP_PORT)]
MEMBERS = {
    "NETAGENT-T-IPI": ["10.0.0.1,80,10.0.0.1", "10.0.0.2,UDP:53,10.0.0.2", "10.0.0.3,sctp:9,10.0.0.3"],
    "NETAGENT-T-IPP": ["10.96.0.1,443", "10.96.0.10,udp:53"],
    "NETAGENT-T-IPN": ["10.0.0.1,tcp:80,192.168.1.7/24", "10.0.0.1,tcp:80,192.168.2.1"],
    "NETAGENT-T-NET": ["10.1.2.3/16", "10.2.0.1/32"],
    "NETAGENT-T-IP": ["10.0.0.1/32", "10.0.0.2"],
    "NETAGENT-T-PORT": ["30080", "udp:30053"],
}


def test_fake_and_real_agree_step_by_step(runner, netns):
    fake = FakeIpset()
    for spec in SETS:
        both(runner, fake, lambda ipset: sync_set(ipset, spec, MEMBERS[spec.name]))
    assert state(runner)["NETAGENT-T-IPI"][1] == {"10.0.0.1,tcp:80,10.0.0.1", "10.0.0.2,udp:53,10.0.0.2",
                                                  "10.0.0.3,sctp:9,10.0.0.3"}
    assert state(runner)["NETAGENT-T-PORT"][1] == {"30080", "30053"}
    for spec in SETS:   # in agreement: nothing to do
        assert both(runner, fake, lambda ipset: sync_set(ipset, spec, MEMBERS[spec.name])) == ("ok", (0, 0))
    ipi = SETS[0].name
    both(runner, fake, lambda ipset: ipset.update(ipi, add=["10.0.0.1,tcp:80,10.0.0.1", "10.0.0.4,tcp:80,10.0.0.4"],
                                                  remove=["10.0.0.3,sctp:9,10.0.0.3", "10.9.9.9,tcp:1,10.9.9.9"]))
    both(runner, fake, lambda ipset: ipset.update(ipi, add=["10.0.0.5,tcp:80,10.0.0.5", "nonsense"]))
    both(runner, fake, lambda ipset: ipset.update("NETAGENT-T-ABSENT", add=["10.0.0.1"]))
    both(runner, fake, lambda ipset: ipset.members("NETAGENT-T-ABSENT"))
    both(runner, fake, lambda ipset: ipset.destroy("NETAGENT-T-ABSENT"))

    # many sets at once: one read, one restore; then a batch where one set is missing
    assert both(runner, fake, lambda ipset: sync_sets(ipset, {SETS[1]: ["10.96.0.1,443", "10.96.0.2,udp:53"],
                                                              SETS[3]: MEMBERS["NETAGENT-T-NET"]})) == \
        ("ok", {"NETAGENT-T-IPP": (1, 1), "NETAGENT-T-NET": (0, 0)})
    both(runner, fake, lambda ipset: ipset.update_many({"NETAGENT-T-IPP": (["10.96.0.3,tcp:80"], ["10.96.0.1,443"]),
                                                        "NETAGENT-T-NET": (["10.3.0.0/16"], [])},
                                                       types={"NETAGENT-T-NET": IpsetType.HASH_NET}))
    both(runner, fake, lambda ipset: ipset.update_many({"NETAGENT-T-ABSENT": (["10.0.0.1"], [])},
                                                       types={"NETAGENT-T-ABSENT": IpsetType.HASH_IP}))

    small = IpsetSpec("NETAGENT-T-SMALL", IpsetType.HASH_IP, max_elements=2)
    both(runner, fake, lambda ipset: ipset.ensure_set(small))
    both(runner, fake, lambda ipset: ipset.update(small.name, add=["10.0.0.1", "10.0.0.2", "10.0.0.3"]))
    assert runner.describe(small.name).max_elements == 2

    # wrong type, unused: recreated empty with the wanted type
    both(runner, fake, lambda ipset: ipset.ensure_set(IpsetSpec("NETAGENT-T-IP", IpsetType.HASH_NET)))
    assert runner.describe("NETAGENT-T-IP").type is IpsetType.HASH_NET

    # in use by a real iptables rule: neither destroyed nor recreated
    namespaces.run_in(netns, ["iptables", "-A", "INPUT", "-m", "set", "--match-set", ipi, "dst,dst,src",
                              "-j", "ACCEPT"], check=True)
    fake.reference(ipi)
    assert runner.describe(ipi).references == fake.describe(ipi).references == 1
    both(runner, fake, lambda ipset: ipset.destroy(ipi))
    both(runner, fake, lambda ipset: ipset.ensure_set(IpsetSpec(ipi, IpsetType.HASH_IP)))
    both(runner, fake, lambda ipset: delete_owned_sets(ipset))
    assert runner.list_names() == [ipi]
    namespaces.run_in(netns, ["iptables", "-F", "INPUT"], check=True)
    fake.release(ipi)
    both(runner, fake, lambda ipset: delete_owned_sets(ipset))
    assert runner.list_names() == []


def test_thousands_of_members_in_one_exec(runner):
    spec = IpsetSpec("NETAGENT-T-BIG", IpsetType.HASH_IP_PORT_IP)
    members = [f"10.{i >> 8 & 255}.{i & 255}.1,tcp:{1000 + i % 50},10.{i >> 8 & 255}.{i & 255}.1"
               for i in range(5000)]
    assert sync_set(runner, spec, members) == (5000, 0)
    assert len(runner.members(spec.name)) == 5000
    assert sync_set(runner, spec, members[100:]) == (0, 100)
    runner.destroy(spec.name)


def test_runner_leaves_sets_of_others_alone(runner, netns):
    namespaces.run_in(netns, ["ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port"], check=True)
    sync_set(runner, SETS[0], MEMBERS[SETS[0].name])
    assert sorted(runner.list_names()) == ["KUBE-CLUSTER-IP", SETS[0].name]
    assert delete_owned_sets(runner) == [SETS[0].name]
    assert runner.list_names() == ["KUBE-CLUSTER-IP"]
    with pytest.raises(ValueError):
        runner.destroy("KUBE-CLUSTER-IP")
    out = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True).stdout
    assert "NETAGENT-T-" not in out, "a test set appeared in the root namespace"


@pytest.mark.parametrize("line", ['create "NETAGENT-T-Q" hash:ip', "create NETAGENT-T-T\thash:ip\r",
                                  "create NETAGENT-T-Z hash:ip\x00 garbage", "  # create NETAGENT-T-C hash:ip",
                                  'create NETAGENT-T-J"OIN" hash:ip', "\r"])
def test_split_ipset_line_reads_like_the_real_ipset_restore(runner, line):
    """The tokenizer the property tests judge ipset text with (tokens.split_ipset_line) agrees
    with ipset restore on quotes, blanks, NUL and comment lines."""
    done = runner._run("restore", stdin=line + "\n")
    tokens = split_ipset_line(line)
    assert done.returncode == 0, done.stderr
    assert runner.list_names() == ([tokens[1]] if tokens else [])
    if tokens:
        runner.destroy(tokens[1])
