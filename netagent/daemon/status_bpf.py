"""`netagent status bpf`: the eBPF proxy's programs, where they are attached, and map fill.

Read from the kernel only: the programs attached to `--cgroup-root` at the four socket hooks
(IPv4's and IPv6's; every one, ours marked, so a foreign program sharing the cgroup shows too), our tc filters on
this network namespace's devices, and every map of ours pinned under `--bpf-root` with its
entries and capacity (a map 90 % full or more is marked; socket storage, `na_sock_revnat`,
has neither: its entries live in the sockets; so has IPv6's `na_sock_revnat6`). Nothing is compiled or written. `--json` prints
`{"cgroup", "programs": [{"hook", "id", "name", "tag", "ours"}], "tc": [{"device", "name"}],
"bpf_root", "maps": [{"name", "entries", "max_entries", "near_full"}]}` (entries and
max_entries null for socket storage).
"""
from __future__ import annotations

import json
import os


def bpf_status(*, bpf_root: str | None, cgroup: str | None) -> dict:
    from ebpf import syscall
    from ebpf.loader import attached_programs, check_bpf_root, check_cgroup, pin_dir
    from ebpf.maps import PINNED_NAMES, SOCKET_STORAGE_MAPS
    from ebpf.sizes import NEAR_FULL
    from ebpf.tc import attached_tc
    status: dict = {"cgroup": cgroup, "programs": [], "tc": [{"device": device, "name": name}
                                                           for device, name in attached_tc()],
                    "bpf_root": bpf_root, "maps": []}
    if cgroup:
        check_cgroup(cgroup)
        status["programs"] = [{"hook": p.attach_type, "id": p.id, "name": p.name, "tag": p.tag, "ours": p.ours}
                              for p in attached_programs(cgroup)]
    if bpf_root:
        check_bpf_root(bpf_root)
        for name in PINNED_NAMES:
            path = os.path.join(pin_dir(bpf_root), name)
            if not os.path.exists(path):
                continue
            if name in SOCKET_STORAGE_MAPS:
                status["maps"].append({"name": name, "entries": None, "max_entries": None, "near_full": False})
                continue
            fd = syscall.obj_get(path)
            try:
                info = syscall.map_info(fd)
                entries = syscall.map_count(fd, info.key_size, info.value_size)
                status["maps"].append({"name": name, "entries": entries, "max_entries": info.max_entries,
                                       "near_full": entries >= NEAR_FULL * info.max_entries})
            finally:
                os.close(fd)
    return status


def render_bpf_status(status: dict, *, as_json: bool = False) -> str:
    if as_json:
        return json.dumps(status, indent=2)
    lines = [f"cgroup {status['cgroup'] or '(not given: --cgroup-root)'}: {len(status['programs'])} program(s)"]
    lines += [f"  {p['hook']:<13} id {p['id']:<6} {p['name']:<16} tag {p['tag']}{'' if p['ours'] else '  (not ours)'}"
              for p in status["programs"]]
    lines += [f"  tc on {t['device']:<10} {t['name']}" for t in status["tc"]]
    lines.append(f"bpf root {status['bpf_root'] or '(not given: --bpf-root)'}: {len(status['maps'])} pinned map(s)")
    for m in status["maps"]:
        if m["entries"] is None:
            lines.append(f"  {m['name']:<14} (socket storage: entries live in the sockets)")
        else:
            near = "  NEAR FULL" if m["near_full"] else ""
            lines.append(f"  {m['name']:<14} {m['entries']:>9} / {m['max_entries']:<9} entries{near}")
    return "\n".join(lines)
