"""The netagent side of the end-to-end tests: install the plugin, run the agent, check leftovers.

Shared by `test_containerd.py` (ctr's CNI path) and `test_cri.py` (the kubelet's path through
containerd's CRI plugin), so that both tiers install and serve the plugin the same way a node
does: `netagent cni install` writes the static shim and the conflist, and `netagent run
--cni-only` serves the socket named in it from the node's network namespace. `running` is
how every node daemon of these tiers is started and stopped (also `test_cri_policy.py`'s API
server and full agent).
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import shutil
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NETAGENT = REPO / ".venv" / "bin" / "netagent"
NETAGENT_MISSING = (f"the netagent entry point {NETAGENT} is not installed "
                    f"(`pip install -e .` in the project's virtual environment)")


def install_netagent(*, bin_dir: Path, conf_dir: Path, subnet: str, data_dir: Path,
                     socket_path: Path) -> Path:
    """`netagent cni install` into the test's directories; return the conflist it wrote.

    The test's own socket, so that no agent that might run on this machine at the default
    socket can answer for the plugin."""
    install = subprocess.run(
        [str(NETAGENT), "cni", "install", "--bin-dir", str(bin_dir), "--conf-dir", str(conf_dir),
         "--subnet", subnet, "--mode", "bridge", "--data-dir", str(data_dir),
         "--socket", str(socket_path)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert install.returncode == 0, install.stderr
    assert (bin_dir / "netagent").exists() and (bin_dir / "netagent-ipam").exists()
    assert (bin_dir / "netagent").read_bytes()[:4] == b"\x7fELF", "the shim, not a script"
    conflists = sorted(conf_dir.glob("*.conflist"))
    assert conflists, f"no .conflist in {conf_dir}: {sorted(conf_dir.iterdir())}"
    return conflists[0]


REFERENCE_PLUGINS = Path("/usr/lib/cni")
# What a CRI node's conflist chains after the main plugin, as the common cluster networks do:
# hostPorts (the runtime's `portMappings`) and the pods' bandwidth annotations (`bandwidth`).
CHAINED = {"portmap": "portMappings", "bandwidth": "bandwidth"}


def missing_reference_plugins() -> list[str]:
    """The reference plugins a CRI node needs (containerd always runs `loopback`) that
    Debian's containernetworking-plugins has not installed here."""
    return [p for p in ("loopback", *CHAINED) if not (REFERENCE_PLUGINS / p).exists()]


def chain_reference_plugins(bin_dir: Path, conflist: Path) -> dict:
    """Copy loopback and the CHAINED plugins into `bin_dir` (copies: the runtime looks in that
    one directory) and append the CHAINED plugins to `conflist`; return the new network."""
    for plugin in ("loopback", *CHAINED):
        shutil.copy2(REFERENCE_PLUGINS / plugin, bin_dir / plugin)
    network = json.loads(conflist.read_text())
    network["plugins"] += [{"type": p, "capabilities": {c: True}} for p, c in CHAINED.items()]
    conflist.write_text(json.dumps(network))
    return network


def bridge_name(conflist: Path) -> str:
    return json.loads(conflist.read_text())["plugins"][0].get("bridge", "na0")


def reservations(data_dir: Path, container_ids) -> list[Path]:
    """IPAM files that hold an allocation: named after an IP address (host-local's layout) or
    naming one of the CNI container ids (any other layout that records the owner)."""
    found = []
    for path in sorted(data_dir.rglob("*")):
        if not path.is_file():
            continue
        try:
            ipaddress.ip_address(path.name)
            found.append(path)
            continue
        except ValueError:
            pass
        text = path.read_text(errors="replace")
        if any(cid in text for cid in container_ids):
            found.append(path)
    return found


@contextlib.contextmanager
def running(argv: list[str], log_path: Path, *, ready, cwd: Path | None = None, env: dict | None = None):
    """A node daemon started with `argv`, its output appended to `log_path`, yielded once
    `ready()` holds (it must not exit first); stopped on exit."""
    with open(log_path, "ab") as log:
        daemon = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  cwd=cwd, env=env)
    try:
        deadline = time.monotonic() + 60   # a Python start-up: seconds on a loaded machine
        while not ready():
            assert daemon.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.02)
        yield daemon
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


@contextlib.contextmanager
def agent_in(node, socket_path: Path, log_path: Path):
    """`netagent run --cni-only` where the node's daemons run (`node.daemon_argv()`: its
    network namespace, and containerd's mount namespace for a CRI node), serving
    `socket_path`; stopped on exit."""
    with running([*node.daemon_argv(), str(NETAGENT), "run", "--cni-only", "--cni-socket", str(socket_path)],
                 log_path, ready=socket_path.exists) as agent:
        yield agent


def settle(journal: Path, timeout: float = 30.0) -> None:
    """Wait until the agent finished every DEL it acknowledged or the shim journaled while
    no agent listened (its journal holds no `.json` or `.wire` record)."""
    deadline = time.monotonic() + timeout
    while journal.is_dir() and [p for p in journal.iterdir() if p.suffix in (".json", ".wire")]:
        assert time.monotonic() < deadline, sorted(journal.iterdir())
        time.sleep(0.02)
