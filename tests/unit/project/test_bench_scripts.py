"""Every benchmark script still starts, and the service proxy bench's pure parts hold their shape.

The benchmarks need root and minutes, so the suite does not run them; `--help` imports
everything a script imports and parses its arguments, which is where a refactor breaks them.
The service proxy bench's records (`--json`), its tables and goals, its argument checks and
its kube-proxy nftables floor renderer are pure, so they are checked here on small inputs.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


@pytest.fixture(scope="module")
def bench_path():
    sys.path.insert(0, str(BENCH))
    yield
    sys.path.remove(str(BENCH))


def test_the_helper_modules_are_not_taken_for_scripts() -> None:
    assert "service_proxy.py" in SCRIPTS and "network_policy.py" in SCRIPTS
    assert not {"bench_records.py", "kube_proxy_floor.py", "service_proxy_kit.py"} & set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_starts(script):
    done = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


@pytest.mark.parametrize("topology", ["mesh", "reflectors"])
def test_bgp_bench_fleet_configs_parse_in_bird(topology, tmp_path):
    """bench/bgp.py's BIRD-only fleets run the product's rendered configs: every node's parses."""
    from bench.bgp import Fleet
    fleet = Fleet(members=4, samples=1, topology=topology, bfd=True)
    for index in fleet.indexes:
        path = tmp_path / f"n{index}.conf"
        path.write_text(fleet.render(index))
        done = subprocess.run(["bird", "-p", "-c", str(path)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr


def test_json_records_have_exactly_the_issue_fields(bench_path, tmp_path) -> None:
    from bench_records import FIELDS, record, write_json
    records = [record("nftables", 100, full=0.5, change=0.002, agent=0.02, connect=(30e-6, 90e-6), rss=80.0,
                      rules=2300),
               record("floor-kube-proxy-nftables", 100, full=0.07, change=0.015, connect=(25e-6, 60e-6), rules=2225),
               record("floor-kube-proxy-iptables-nft", 10000)]
    records[0]["private"] = "not in the file"
    out = tmp_path / "bench.json"
    write_json(str(out), records)
    loaded = json.loads(out.read_text())
    assert [list(rec) for rec in loaded] == [list(FIELDS)] * 3
    assert loaded[0] == {"mode": "nftables", "services": 100, "full_sync_s": 0.5, "change_s": 0.002,
                         "agent_change_s": 0.02, "connect_median_us": 30.0, "connect_p99_us": 90.0, "rss_mib": 80.0,
                         "cpu_s": None, "rules": 2300, "version": None}
    assert loaded[2]["full_sync_s"] is None and loaded[2]["mode"].startswith("floor-kube-proxy-")
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]   # no temporary file left


def test_the_table_puts_modes_side_by_side_with_ratios(bench_path) -> None:
    from bench_records import record, table_lines
    records = [record("nftables", 1000, full=0.2, change=0.004, connect=(20e-6, 50e-6), rss=60.0, rules=100),
               record("floor-kube-proxy-nftables", 1000, full=1.0, change=0.05, connect=(25e-6, 60e-6), rules=200),
               record("iptables-legacy", 1000, full=0.4, change=0.002, agent=0.03, connect=(40e-6, 90e-6), rss=30.0,
                      rules=300)]
    lines = table_lines(1000, records, ["floor-kube-proxy-iptables-nft: skipped"])
    assert lines[0].startswith("== 1000 services")
    assert [line.split()[0] for line in lines[2:5]] == ["nftables", "floor-kube-proxy-nftables", "iptables-legacy"]
    assert lines[2].split()[3] == "-"   # no agent-path figure: a dash, not a zero
    assert "nftables / floor-kube-proxy-nftables: full 0.20x, change 0.08x" in lines[5]
    assert "nftables / iptables-legacy: full 0.50x, change 2.00x, agent change -, connect median 0.50x, RSS 2.00x" \
        in lines[6]
    assert lines[-1] == "  note: floor-kube-proxy-iptables-nft: skipped"


def test_the_real_kube_proxy_is_recorded_and_set_beside_its_mode(bench_path, tmp_path) -> None:
    from bench_records import goal_lines, record, table_lines, write_json
    records = [record("nftables", 1000, full=0.2, change=0.002, agent=0.01, connect=(20e-6, 50e-6), rss=40.0,
                      rules=30, cpu=0.1, version="0.1.0 (abc)"),
               record("kube-proxy-nftables", 1000, full=0.8, change=0.04, agent=0.04, connect=(25e-6, 60e-6),
                      rss=80.0, rules=1400, cpu=0.5, version="v1.37.2"),
               record("iptables-legacy", 1000, full=0.4, agent=0.03, rss=30.0, cpu=0.2)]
    write_json(str(tmp_path / "r.json"), records)
    peer = json.loads((tmp_path / "r.json").read_text())[1]
    assert peer["version"] == "v1.37.2" and peer["cpu_s"] == 0.5 and peer["mode"] == "kube-proxy-nftables"
    lines = table_lines(1000, records, [])
    assert lines[1].split()[-2:] == ["CPU", "s"] and lines[2].split()[-1] == "0.10"
    assert ("nftables / kube-proxy-nftables: full 0.25x, change through the API 0.25x, connect median 0.80x, "
            "RSS 0.50x, CPU 0.20x") in lines
    assert not any(line.startswith("iptables-legacy / ") for line in lines)   # no real peer of that mode ran
    assert "full sync <= 0.5x the real kube-proxy-nftables: 0.25x: met" in goal_lines(records)


def test_goals_are_judged_at_the_largest_size(bench_path) -> None:
    from bench_records import goal_lines, record
    records = [record("nftables", 100, full=0.01, change=0.001, connect=(20e-6, 50e-6)),
               record("nftables", 10000, full=1.5, change=0.004, connect=(30e-6, 70e-6)),
               record("floor-kube-proxy-nftables", 10000, full=100.0, change=1.0)]
    lines = goal_lines(records, {10000: 0})
    assert "measured at 10000 services" in lines[0]
    assert lines[1].endswith("1.500 s: MISSED")
    assert lines[2].endswith("0.015x: met")   # small ratios keep two significant digits
    assert "direct 4.00 ms: met" in lines[3]
    assert lines[4].endswith("0 nft transactions: met")
    assert lines[5] == "connect() median at 10000 within 1.2x of that at 100: 1.50x: MISSED"
    assert goal_lines([record("iptables-legacy", 100, full=0.1)]) == []


def test_service_proxy_arguments_are_checked(bench_path) -> None:
    sys.path.insert(0, str(BENCH.parent))
    from service_proxy import parse_args
    args = parse_args(["--services", "100,1000", "--modes", "nftables,ebpf", "--json", "x.json"])
    assert args.services == [100, 1000] and args.modes == ["nftables", "ebpf"] and args.json == "x.json"
    assert args.kube_proxy == ["kube-proxy-iptables-legacy", "kube-proxy-iptables-nft", "kube-proxy-nftables"]
    assert args.floors == "auto"
    assert parse_args(["--kube-proxy", "kube-proxy-nftables"]).kube_proxy == ["kube-proxy-nftables"]
    for bad in (["--services", "1k"], ["--services", "0"], ["--modes", "nftables,userspace"], ["--modes", ","],
                ["--kube-proxy", "kube-proxy-ipvs"], ["--floors", "sometimes"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_the_kube_proxy_nftables_floor_has_its_structure(bench_path) -> None:
    from kube_proxy_floor import endpoint_chain, nftables_change, nftables_shaped, service_chain
    from service_proxy_kit import make_state, with_one_endpoint_changed
    state = make_state(20)
    text = nftables_shaped(state)
    lines = text.splitlines()
    names = sorted(state.services, key=lambda n: int(n.name.split("-")[1]))
    chains = [line.split()[4] for line in lines if line.startswith("add chain ip kube-proxy ")]
    assert len(set(chains)) == len(chains)
    assert sum(c.startswith("service-") and "/" in c for c in chains) == 20
    assert sum(c.startswith("endpoint-") for c in chains) == 200
    assert sum(c.startswith("external-") for c in chains) == 2   # svc-0 and svc-10 have NodePorts
    assert service_chain(names[3]).endswith("-bench/svc-3/tcp/http")
    assert "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips" in lines
    assert f"add element ip kube-proxy service-ips {{ 10.96.0.3 . tcp . 80 : goto {service_chain(names[3])} }}" in lines
    picks = [line for line in lines if line.startswith(f"add rule ip kube-proxy {service_chain(names[3])} numgen")]
    assert len(picks) == 1 and "numgen random mod 10 vmap { 0 : goto endpoint-" in picks[0]
    first = state.endpoints[names[3]][0]
    assert (f"add rule ip kube-proxy {endpoint_chain(names[3], first.ip, 8080)} meta l4proto tcp "
            f"dnat to {first.ip}:8080") in lines

    new, name = with_one_endpoint_changed(state, 1)
    change = nftables_change(state, new, name).splitlines()
    gone, added = state.endpoints[name][0], new.endpoints[name][0]
    assert f"add chain ip kube-proxy {endpoint_chain(name, added.ip, 8080)}" in change
    assert f"flush chain ip kube-proxy {service_chain(name)}" in change
    assert change[-1] == f"flush chain ip kube-proxy {endpoint_chain(name, gone.ip, 8080)}"
    assert sum(line.startswith("add rule") for line in change) == 4   # 2 for the new endpoint, 2 for the service


def test_network_policy_bench_offers_both_dataplanes() -> None:
    done = subprocess.run([sys.executable, str(BENCH / "network_policy.py"), "--help"], capture_output=True, text=True,
                          timeout=60)
    assert "--backend {iptables,nftables}" in done.stdout
    refused = subprocess.run([sys.executable, str(BENCH / "network_policy.py"), "--backend", "ipvs"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "invalid choice: 'ipvs'" in refused.stderr
