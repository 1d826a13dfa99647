"""One lab node without a cluster: the CNI plugin and its agent (`--cni-only`) in a namespace.

`LabNode` is a node namespace, the plugin installed into a private directory (the Python
client by default, which works in-process without an agent; the static C shim with
`plugin=PluginBinary.SHIM`), the agent (`netagent run --cni-only`) started inside the node,
and pods created by executing the plugin binary exactly as a runtime would (environment,
config on stdin, from the node's namespace). The CNI tests and the CNI benchmark use it; `exec_plugin` is
shared with the cluster lab. Everything is removed on exit, also after errors.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from cni import invoke
from cni.errors import CniError
from netagent.cniserver import install as cni_install
from netagent.cniserver.deferred_delete import journal_dir_for
from netagent.kernel import namespaces, owned
from netagent.kernel.pod_attachment import PodAttachment


@dataclass
class Pod:
    name: str
    container_id: str
    netns_name: str
    ifname: str
    result: dict

    @property
    def netns(self) -> str:
        return namespaces.netns_path(self.netns_name)

    @property
    def ip(self) -> str:
        return self.result["ips"][0]["address"].split("/")[0]


def exec_plugin(*, node_netns: str, bin_dir: str, command: str, config: bytes, container_id: str = "",
                netns: str = "", ifname: str = "eth0", args: str = "", env_overrides: dict | None = None,
                host_view: list | None = None):
    """Execute our plugin from a node's namespace as a runtime does; return (exit code, stdout JSON).

    `host_view` prefixes the command (the cluster lab's view of a node's own /run and /opt)."""
    env = invoke.cni_environment(command=command, container_id=container_id, netns=netns,
                                 ifname=ifname, args=args, path=(bin_dir, "/usr/lib/cni"))
    env.update(env_overrides or {})
    proc = subprocess.run([*(host_view or []), *namespaces.exec_prefix(node_netns), os.path.join(bin_dir, "netagent")],
                          input=config, env=env, capture_output=True, timeout=120)
    out = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, out


def raise_for_failure(code: int, out: dict | None, command: str) -> None:
    """A plugin exit status and its error object, as the CniError a runtime would report."""
    if code != 0:
        out = out or {}
        raise CniError(out.get("code", 100), out.get("msg", f"{command} failed"), out.get("details", ""))


class LabNode:
    """One node: its namespace, its plugin install, optionally its agent, and its pods."""

    def __init__(self, *, prefix: str = "na-lab", mode: PodAttachment = PodAttachment.BRIDGE,
                 subnets: tuple = ("10.244.1.0/24",), with_agent: bool = True,
                 cni_version: str = "1.0.0", mtu: int = 1500, ipam: dict | None = None,
                 plugin: cni_install.PluginBinary = cni_install.PluginBinary.PYTHON) -> None:
        self.prefix = namespaces.unique_name(prefix)
        self.node = f"{self.prefix}-node"
        self.mode = mode
        self.with_agent = with_agent
        self.plugin = plugin
        self.workdir = tempfile.mkdtemp(prefix=f"{self.prefix}-")
        self.bin_dir = os.path.join(self.workdir, "bin")
        self.data_dir = os.path.join(self.workdir, "ipam")
        self.socket_path = os.path.join(self.workdir, "run", "cni.sock")
        self.journal_dir = journal_dir_for(self.socket_path)
        self.agent_log = os.path.join(self.workdir, "agent.log")
        self.conflist = cni_install.render_conflist(
            name="netagent", subnets=list(subnets), mode=mode, bridge=owned.DEFAULT_BRIDGE, mtu=mtu,
            socket_path=self.socket_path, data_dir=self.data_dir, cni_version=cni_version)
        if ipam is not None:
            self.conflist["plugins"][0]["ipam"] = ipam
        self.pods: dict[str, Pod] = {}
        self.node_address = "198.18.0.1"  # RFC 2544 benchmarking range, inside the node only
        self._agent: subprocess.Popen | None = None
        self._netns_names: list[str] = []

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "LabNode":
        try:
            self._netns_names.append(self.node)
            namespaces.create(self.node)
            self._add_node_address()
            cni_install.install(bin_dir=self.bin_dir, conf_dir=None, name="netagent", subnets=[],
                                mode=self.mode, bridge=owned.DEFAULT_BRIDGE, mtu=1500,
                                socket_path=self.socket_path, data_dir=self.data_dir, plugin=self.plugin)
            if self.with_agent:
                self.start_agent()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _add_node_address(self) -> None:
        """Give the node an address of its own, as a real node has on its uplink."""
        namespaces.run_in(self.node, ["ip", "addr", "add", self.node_address + "/32", "dev", "lo"],
                          check=True)

    def start_agent(self, *, timeout: float = 60.0) -> None:
        """Start the agent and return once it serves its socket.

        The socket file alone is no sign of that: it exists from the agent's bind (before its
        listen and its adoption of the shim's journaled DELs), and an agent killed with -9
        leaves a stale one behind. The agent prints its "serving CNI" line after all of that,
        so this waits for that line in the part of the log this start wrote."""
        log = open(self.agent_log, "ab")
        start_of_this_run = log.tell()
        self._agent = subprocess.Popen(
            [*namespaces.exec_prefix(self.node), sys.executable, "-m", "netagent.cli",
             "--log-level", "INFO", "run", "--cni-only", "--cni-socket", self.socket_path],
            stdout=log, stderr=subprocess.STDOUT, cwd=cni_install.code_root())
        log.close()
        deadline = time.monotonic() + timeout
        ready = f"serving CNI on {self.socket_path}".encode()
        while ready not in self._agent_log_since(start_of_this_run):
            if self._agent.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the agent did not start within {timeout} s; its log:\n{self.agent_output()}")
            time.sleep(0.02)

    def pending_deletes(self) -> int:
        """DELs the agent acknowledged and is still finishing (its journal)."""
        if not os.path.isdir(self.journal_dir):
            return 0
        return sum(name.endswith(".json") for name in os.listdir(self.journal_dir))

    def settle(self, *, timeout: float = 60.0) -> None:
        """Wait until the agent has finished every acknowledged DEL."""
        deadline = time.monotonic() + timeout
        while self.pending_deletes() and self._agent is not None and self._agent.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.pending_deletes()} DEL(s) still pending after {timeout} s")
            time.sleep(0.01)

    def stop_agent(self, *, sig: int = signal.SIGTERM) -> None:
        if self._agent is None:
            return
        if self._agent.poll() is None:
            self._agent.send_signal(sig)
            try:
                self._agent.wait(timeout=60)  # a graceful stop on a loaded machine can take seconds
            except subprocess.TimeoutExpired:
                self._agent.kill()
                self._agent.wait()
        self._agent = None

    def _agent_log_since(self, offset: int) -> bytes:
        with open(self.agent_log, "rb") as f:
            f.seek(offset)
            return f.read()

    def agent_output(self) -> str:
        with contextlib.suppress(OSError), open(self.agent_log, errors="replace") as f:
            return f.read()
        return ""

    def close(self) -> None:
        for pod in list(self.pods.values()):
            with contextlib.suppress(Exception):
                self.delete_pod(pod.name)
        self.stop_agent()
        for name in reversed(self._netns_names):
            namespaces.remove(name)
        self._netns_names.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # ------------------------------------------------------------ the runtime's part
    def plugin_config(self, *, prev_result: dict | None = None, **overrides) -> bytes:
        conf = json.loads(invoke.plugin_config(self.conflist, 0, prev_result=prev_result))
        conf.update(overrides)
        return json.dumps(conf).encode()

    def cni(self, command: str, *, container_id: str = "", netns: str = "", ifname: str = "eth0",
            config: bytes | None = None, args: str = "", env_overrides: dict | None = None):
        """Execute our plugin in the node namespace; return (exit code, decoded stdout)."""
        return exec_plugin(node_netns=self.node, bin_dir=self.bin_dir, command=command,
                           config=config if config is not None else self.plugin_config(),
                           container_id=container_id, netns=netns, ifname=ifname, args=args,
                           env_overrides=env_overrides)

    def new_pod_netns(self, name: str) -> str:
        netns_name = f"{self.prefix}-{name}"
        self._netns_names.append(netns_name)
        namespaces.create(netns_name)
        return netns_name

    def add_pod(self, name: str, *, ifname: str = "eth0") -> Pod:
        netns_name = self.new_pod_netns(name)
        container_id = f"{self.prefix}-{name}"
        code, out = self.cni("ADD", container_id=container_id, netns=namespaces.netns_path(netns_name),
                             ifname=ifname)
        raise_for_failure(code, out, "ADD")
        pod = Pod(name=name, container_id=container_id, netns_name=netns_name, ifname=ifname, result=out)
        self.pods[name] = pod
        return pod

    def delete_pod(self, name: str) -> None:
        pod = self.pods.pop(name)
        code, out = self.cni("DEL", container_id=pod.container_id, netns=pod.netns, ifname=pod.ifname)
        namespaces.remove(pod.netns_name)
        raise_for_failure(code, out, "DEL")

    def exec_in(self, pod_or_node: str, argv: list, **kwargs) -> subprocess.CompletedProcess:
        netns_name = self.node if pod_or_node == "node" else self.pods[pod_or_node].netns_name
        return namespaces.run_in(netns_name, argv, **kwargs)

    def ping(self, source: str, address: str) -> bool:
        """Whether `address` answers an echo request within 10 s (pinging every 0.2 s, done at
        the first reply): a path that works answers at once, however loaded the machine."""
        return self.exec_in(source, ["ping", "-c", "1", "-w", "10", "-i", "0.2", address]).returncode == 0
