"""IptablesRunner on the real kernel, both backends, inside throwaway namespaces: errors name the
failing line, owned-rule operations leave foreign rules alone, backend detection reads the
namespace it is pointed at, and FakeIptables agrees with the real tools step by step."""
import subprocess

import pytest

from netagent.kernel import namespaces
from netagent.kernel.iptables.backend import IptablesBackend, detect_backend
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.runner import FlushMode, IptablesError, IptablesRunner


@pytest.fixture
def runner(netns, backend):
    return IptablesRunner(backend=backend, exec_prefix=namespaces.exec_prefix(netns), timeout=120,
                          lock_wait_seconds=60)  # the xtables lock is shared with every other namespace


BAD_LINES = [
    ("*nat\n:NETAGENT-X - [0:0]\n-A NETAGENT-X -s 10.0.0.0/8 -j RETURN\n-A NETAGENT-X -j NOSUCH\nCOMMIT\n", 4),
    ("*nat\n:NETAGENT-X - [0:0]\n-A NETAGENT-X --bogus -j RETURN\nCOMMIT\n", 3),
    ("*nosuch\n:NETAGENT-X - [0:0]\nCOMMIT\n", 1),
    ("*nat\n:NETAGENT-X - [0:0]\n-A POSTROUTING -j NETAGENT-X\n-X NETAGENT-X\nCOMMIT\n", 4),
    ("*filter\n-D INPUT -j ACCEPT\nCOMMIT\n", 2),
]


@pytest.mark.parametrize("text, line_number", BAD_LINES, ids=["missing-chain", "bad-option", "bad-table",
                                                              "busy-chain", "missing-rule"])
def test_restore_error_names_the_bad_line(runner, text, line_number):
    with pytest.raises(IptablesError) as caught:
        runner.restore(text)
    assert caught.value.line_number == line_number, str(caught.value)
    assert caught.value.line == text.splitlines()[line_number - 1]
    assert text.splitlines()[line_number - 1].strip() in str(caught.value)


def test_ensure_jump_and_delete_owned_leave_foreign_rules_alone(runner):
    runner.restore("*nat\n:DOCKER - [0:0]\n-A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE\n-A POSTROUTING -j DOCKER\nCOMMIT\n"
                   "*nat\n:NETAGENT-A - [0:0]\n-A NETAGENT-A -j RETURN\nCOMMIT\n"
                   "*mangle\n:NETAGENT-M - [0:0]\n-A PREROUTING -j NETAGENT-M\nCOMMIT\n"
                   "*raw\n:NETAGENT-R - [0:0]\n-A OUTPUT -j NETAGENT-R\nCOMMIT\n")
    foreign = runner.tables("nat")["nat"].chains["POSTROUTING"].rules
    assert runner.ensure_jump("nat", "POSTROUTING", "NETAGENT-A", comment="netagent: test jump")
    assert not runner.ensure_jump("nat", "POSTROUTING", "NETAGENT-A", comment="netagent: test jump")
    postrouting = runner.tables("nat")["nat"].chains["POSTROUTING"].rules
    assert postrouting == [("-m", "comment", "--comment", "netagent: test jump", "-j", "NETAGENT-A"), *foreign]
    assert runner.list_chains("nat") == {"NETAGENT-A"}

    removed = runner.delete_owned()
    assert set(removed) == {"nat/NETAGENT-A", "mangle/NETAGENT-M", "raw/NETAGENT-R"}
    assert "NETAGENT" not in runner.save()
    assert runner.tables("nat")["nat"].chains["POSTROUTING"].rules == foreign
    assert runner.delete_owned() == []


def test_version_and_random_fully(runner):
    assert runner.version >= (1, 8)
    assert runner.supports_random_fully


def test_detect_empty_namespace_is_nft(netns):
    assert detect_backend(exec_prefix=namespaces.exec_prefix(netns)) is IptablesBackend.NFT


def test_detect_picks_the_backend_that_holds_rules(netns):
    prefix = namespaces.exec_prefix(netns)
    namespaces.run_in(netns, ["iptables-legacy", "-t", "filter", "-A", "INPUT", "-j", "ACCEPT"], check=True)
    assert detect_backend(exec_prefix=prefix) is IptablesBackend.LEGACY
    for _ in range(2):
        namespaces.run_in(netns, ["iptables-nft", "-t", "filter", "-A", "INPUT", "-j", "ACCEPT"], check=True)
    assert detect_backend(exec_prefix=prefix) is IptablesBackend.NFT


def test_detect_follows_kubelets_hint_over_rule_counts(netns):
    prefix = namespaces.exec_prefix(netns)
    namespaces.run_in(netns, ["iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"], check=True)
    for _ in range(3):
        namespaces.run_in(netns, ["iptables-nft", "-t", "filter", "-A", "INPUT", "-j", "ACCEPT"], check=True)
    assert detect_backend(exec_prefix=prefix) is IptablesBackend.LEGACY


# ---- the fake and the real tools, step by step ---------------------------------------------

PARITY_STEPS = [
    ("*nat\n:NETAGENT-SVC - [0:0]\n:NETAGENT-SEP - [0:0]\n"
     '-A PREROUTING -m comment --comment "netagent: services" -j NETAGENT-SVC\n'
     "-A NETAGENT-SVC -p udp -d 10.96.0.10 -j NETAGENT-SEP\n"
     "-A NETAGENT-SEP -p udp -j DNAT --to-destination 10.244.1.5:53\n"
     "-A POSTROUTING ! -s 10.244.0.0/16 -o lo -j MASQUERADE\nCOMMIT\n"
     "*filter\n:NETAGENT-FWD - [0:0]\n-A FORWARD -j NETAGENT-FWD\n-A NETAGENT-FWD -s 10.244.0.0/16 -j ACCEPT\nCOMMIT\n"),
    "*nat\n:NETAGENT-SEP - [0:0]\n-A NETAGENT-SEP -j NOSUCH\nCOMMIT\n",
    "*nat\n:NETAGENT-A - [0:0]\n-A NETAGENT-A -j NETAGENT-B\n:NETAGENT-B - [0:0]\nCOMMIT\n",
    "*nat\n-X NETAGENT-SEP\nCOMMIT\n",
    "*nat\n:NETAGENT-SEP - [0:0]\n-A NETAGENT-SEP -p udp -j DNAT --to-destination 10.244.2.7:53\nCOMMIT\n",
    "*filter\n:FORWARD DROP [0:0]\nCOMMIT\n",
    "*filter\n-D FORWARD -j ACCEPT\nCOMMIT\n",
    "*filter\n-I INPUT 2 -j ACCEPT\nCOMMIT\n",
    "*nat\n:NETAGENT-M - [0:0]\n-A NETAGENT-M -j MASQUERADE\n-A PREROUTING -j NETAGENT-M\nCOMMIT\n",
    "*filter\n:NETAGENT-GOOD - [0:0]\nCOMMIT\n*nat\n:NETAGENT-BAD - [0:0]\n-A NETAGENT-BAD -j NOPE\nCOMMIT\n",
    "*nat\n:NETAGENT-SVC - [0:0]\n-X NETAGENT-SEP\nCOMMIT\n",
    "*nat\n:NETAGENT-SVC - [0:0]\n-F NETAGENT-SEP\n-X NETAGENT-SEP\nCOMMIT\n",
    # (-R of a rule inserted in the same restore crashes iptables-nft-restore 1.8.9: not replayed here)
    "*filter\n-I INPUT -s 1.1.1.1 -j ACCEPT\n-I INPUT 2 -s 2.2.2.2 -j DROP\n-I INPUT 2 -s 3.3.3.3 -j ACCEPT\n-D INPUT 1\nCOMMIT\n",
    "*filter\n-R INPUT 1 -s 4.4.4.4 -j ACCEPT\n-D INPUT -s 2.2.2.2/32 -j DROP\nCOMMIT\n",
    "*filter\n:NETAGENT-" + "Y" * 20 + " - [0:0]\nCOMMIT\n",
    "*filter\n:NETAGENT-L1 - [0:0]\n:NETAGENT-L2 - [0:0]\n-A NETAGENT-L1 -j NETAGENT-L2\n-A NETAGENT-L2 -j NETAGENT-L1\nCOMMIT\n",
    "*filter\n-A INPUT -j NETAGENT-L1\nCOMMIT\n",
    "*filter\n-N NETAGENT-GOOD\nCOMMIT\n",
    "*filter\n-F NETAGENT-L2\n-X NETAGENT-L1\nCOMMIT\n",
    "*filter\n-F NETAGENT-L1\n-F NETAGENT-L2\n-X NETAGENT-L1\n-X NETAGENT-L2\nCOMMIT\n",
]


def comparable(iptables, table):
    return {name: (chain.policy, chain.rules) for name, chain in iptables.table(table).chains.items()}


def outcome(iptables, text, flush=FlushMode.NO_FLUSH):
    try:
        iptables.restore(text, flush=flush)
    except IptablesError as error:
        return "failed", error.line_number
    return "ok", None


def test_fake_agrees_with_the_real_tools(runner):
    fake = FakeIptables(backend=runner.backend)
    steps = [(text, FlushMode.NO_FLUSH) for text in PARITY_STEPS]
    steps.append(("*filter\n:NETAGENT-FRESH - [0:0]\n-A INPUT -j NETAGENT-FRESH\nCOMMIT\n", FlushMode.FLUSH_TABLES))
    for number, (text, flush) in enumerate(steps):
        real_result, fake_result = outcome(runner, text, flush), outcome(fake, text, flush)
        assert real_result[0] == fake_result[0], f"step {number}: real {real_result}, fake {fake_result}\n{text}"
        for table in ("filter", "nat"):
            assert comparable(runner, table) == comparable(fake, table), f"step {number}, table {table}\n{text}"


def test_save_with_counters_reads_the_kernels_counters(runner, netns):
    """`save(counters=True)` is `iptables-save -c`: each rule led by the packets and bytes it
    matched (what `netagent status policy` and the denied-packets gauge read)."""
    runner.restore("*filter\n:NETAGENT-C - [0:0]\n-A OUTPUT -o lo -j NETAGENT-C\n-A NETAGENT-C -j ACCEPT\nCOMMIT\n")
    subprocess.run([*namespaces.exec_prefix(netns), "ping", "-c", "2", "-i", "0.2", "-W", "5", "127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    counted = [line for line in runner.save("filter", counters=True).splitlines() if "-A NETAGENT-C" in line]
    assert len(counted) == 1 and counted[0].startswith("[")
    packets = int(counted[0][1:].split(":")[0])
    assert packets >= 2
    assert not any(line.startswith("[") for line in runner.save("filter").splitlines())
    runner.delete_owned()
