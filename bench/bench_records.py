"""The service proxy benchmark's records: their one shape, the `--json` file, the tables and the goals.

Every measurement of `bench/service_proxy.py` (a netagent mode, the real kube-proxy's mode, or
a kube-proxy floor, at one size) becomes one record with the keys of `FIELDS` (null where a
figure does not apply, or where the run was cut or skipped: the printed notes say which), the
`version` of what ran. The script prints them side by side per size, with the ratios the issue
asks for (nftables against the kube-proxy nftables floor and against iptables-legacy, each
netagent mode against the real kube-proxy's same mode), and holds the nftables figures against
the issue's goals.
Pure formatting and arithmetic: no kernel, so the tests run it on records of their own.
"""
from __future__ import annotations

import json
import os
import tempfile

FIELDS = ("mode", "services", "full_sync_s", "change_s", "agent_change_s", "connect_median_us", "connect_p99_us",
          "rss_mib", "cpu_s", "rules", "version")
FLOOR_PREFIX = "floor-kube-proxy-"
PEER_PREFIX = "kube-proxy-"   # the real kube-proxy's modes (bench/real_kube_proxy.py)
GOAL_FULL_S = 1.0           # 10,000 services x 10 endpoints: full sync <= 1 s
GOAL_FULL_VS_FLOOR = 0.5    # ... and <= 0.5x the kube-proxy nftables floor
GOAL_CHANGE_S = 0.010       # one endpoint change <= 10 ms
GOAL_CONNECT_GROWTH = 1.2   # connect() median at 10,000 within 1.2x of that at 100


def floor_mode(mode: str) -> str:
    """The floor beside a netagent mode: floor-kube-proxy-nftables, -iptables-legacy, -iptables-nft."""
    return FLOOR_PREFIX + mode


def record(mode: str, services: int, *, full: float | None = None, change: float | None = None,
           agent: float | None = None, connect: tuple[float, float] | None = None, rss: float | None = None,
           rules: int | None = None, cpu: float | None = None, version: str | None = None) -> dict:
    """One measurement; times in seconds in, connect() in microseconds out."""
    median, p99 = connect if connect else (None, None)
    return {"mode": mode, "services": services, "full_sync_s": full, "change_s": change, "agent_change_s": agent,
            "connect_median_us": None if median is None else round(median * 1e6, 1),
            "connect_p99_us": None if p99 is None else round(p99 * 1e6, 1),
            "rss_mib": None if rss is None else round(rss, 1), "cpu_s": None if cpu is None else round(cpu, 3),
            "rules": rules, "version": version}


def write_json(path: str, records: list[dict]) -> None:
    """The records as a JSON list, replaced atomically (a reader never sees half a file)."""
    directory = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp") as out:
        json.dump([{key: rec[key] for key in FIELDS} for rec in records], out, indent=1)
        out.write("\n")
    os.replace(out.name, path)


def _find(records: list[dict], mode: str, services: int | None = None) -> dict | None:
    return next((rec for rec in records if rec["mode"] == mode and services in (None, rec["services"])), None)


def ratio(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or denominator is None or denominator == 0:
        return "-"
    value = numerator / denominator
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"   # 0.0025x, not 0.00x


def _cell(value, scale: float = 1.0, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value * scale:.{digits}f}"


HEADER = (f"{'mode':<34} {'full sync s':>11} {'1 change ms':>11} {'agent chg ms':>12} {'connect med us':>14} "
          f"{'p99 us':>8} {'RSS MiB':>8} {'rules':>8} {'CPU s':>7}")


def table_lines(services: int, records: list[dict], notes: list[str]) -> list[str]:
    lines = [f"== {services} services x 10 endpoints ==", HEADER]
    for rec in records:
        lines.append(f"{rec['mode']:<34} {_cell(rec['full_sync_s']):>11} {_cell(rec['change_s'], 1e3, 2):>11} "
                     f"{_cell(rec['agent_change_s'], 1e3, 2):>12} {_cell(rec['connect_median_us'], digits=1):>14} "
                     f"{_cell(rec['connect_p99_us'], digits=1):>8} {_cell(rec['rss_mib'], digits=0):>8} "
                     f"{_cell(rec['rules']):>8} {_cell(rec.get('cpu_s'), digits=2):>7}")
    nft = _find(records, "nftables")
    for other in (floor_mode("nftables"), "iptables-legacy", "ebpf"):
        base = _find(records, other)
        if nft and base:
            lines.append(f"nftables / {other}: full {ratio(nft['full_sync_s'], base['full_sync_s'])}, "
                         f"change {ratio(nft['change_s'], base['change_s'])}, "
                         f"agent change {ratio(nft['agent_change_s'], base['agent_change_s'])}, "
                         f"connect median {ratio(nft['connect_median_us'], base['connect_median_us'])}, "
                         f"RSS {ratio(nft['rss_mib'], base['rss_mib'])}")
    for rec in records:   # netagent / the real kube-proxy, mode by mode
        peer = _find(records, PEER_PREFIX + rec["mode"])
        if peer:
            lines.append(f"{rec['mode']} / {peer['mode']}: full {ratio(rec['full_sync_s'], peer['full_sync_s'])}, "
                         f"change through the API {ratio(rec['agent_change_s'], peer['change_s'])}, "
                         f"connect median {ratio(rec['connect_median_us'], peer['connect_median_us'])}, "
                         f"RSS {ratio(rec['rss_mib'], peer['rss_mib'])}, CPU {ratio(rec.get('cpu_s'), peer['cpu_s'])}")
    lines += [f"  note: {note}" for note in notes]
    return lines


def print_table(services: int, records: list[dict], notes: list[str]) -> None:
    print("\n".join(["", *table_lines(services, records, notes)]), flush=True)


def goal_lines(records: list[dict], restarts: dict[int, int] | None = None) -> list[str]:
    """The issue's goals for nftables, at the largest size run (they are set at 10,000)."""
    nft = sorted((rec for rec in records if rec["mode"] == "nftables"), key=lambda rec: rec["services"])
    if not nft:
        return []
    top = nft[-1]
    # the goal is set against the kube-proxy nftables floor; where only the real one ran, against it
    floor = _find(records, floor_mode("nftables"), top["services"]) or _find(records, PEER_PREFIX + "nftables",
                                                                              top["services"])
    at = f"at {top['services']} services"
    lines = [f"== goals (set at 10,000 services; measured {at}) =="]

    def verdict(ok: bool | None) -> str:
        return "n/a" if ok is None else ("met" if ok else "MISSED")

    full, change = top["full_sync_s"], top["change_s"]
    lines.append(f"full sync <= {GOAL_FULL_S:.0f} s: {_cell(full)} s: {verdict(None if full is None else full <= GOAL_FULL_S)}")
    floor_full = floor["full_sync_s"] if floor else None
    against = "kube-proxy nftables floor" if floor is None or floor["mode"].startswith(FLOOR_PREFIX) \
        else f"the real {floor['mode']}"
    lines.append(f"full sync <= {GOAL_FULL_VS_FLOOR}x {against}: {ratio(full, floor_full)}: "
                 f"{verdict(None if None in (full, floor_full) else full <= GOAL_FULL_VS_FLOOR * floor_full)}")
    lines.append(f"one endpoint change <= {GOAL_CHANGE_S * 1e3:.0f} ms: direct {_cell(change, 1e3, 2)} ms: "
                 f"{verdict(None if change is None else change <= GOAL_CHANGE_S)}; through the API "
                 f"{_cell(top['agent_change_s'], 1e3, 2)} ms")
    if restarts and top["services"] in restarts:
        written = restarts[top["services"]]
        lines.append(f"restart's first sync with the table in place writes nothing: {written} nft transactions: "
                     f"{verdict(written == 0)}")
    with_connect = [rec for rec in nft if rec["connect_median_us"] is not None]
    if len(with_connect) >= 2:
        low, high = with_connect[0], with_connect[-1]
        growth = high["connect_median_us"] / low["connect_median_us"]
        caveat = "" if low["services"] <= 100 else f" (the goal compares with 100 services; smallest run: {low['services']})"
        lines.append(f"connect() median at {high['services']} within {GOAL_CONNECT_GROWTH}x of that at {low['services']}: "
                     f"{growth:.2f}x: {verdict(growth <= GOAL_CONNECT_GROWTH)}{caveat}")
    return lines


def print_goals(records: list[dict], restarts: dict[int, int] | None = None) -> None:
    lines = goal_lines(records, restarts)
    if lines:
        print("\n".join(["", *lines]), flush=True)
