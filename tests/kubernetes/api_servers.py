"""The two API servers the parity tests hold side by side: the lab's and the real kube-apiserver.

`LabApi` runs `lab.apiserver.ApiServer` in-process on a loopback port with a state file (so a
restart keeps objects and the counter, as `python -m lab.apiserver --state` does); `RealApi`
runs the built etcd and kube-apiserver (`build/kubernetes/bin`, what `lab up --kubernetes`
runs) on free loopback ports of the root namespace, TLS with the certificates of
`lab.kubernetes.pki`, the admin identity (`system:masters`) for every request, RBAC on. Both
answer the same `ApiEndpoint` surface: a kubeconfig for the agent's own client
(`netagent.kube.config.load_api_client`), and `restart()` (the API server process only: etcd, like
the lab's state file, survives). Nothing here changes the root
namespace beyond listening on loopback ports; every process started is stopped by its pid.
"""
from __future__ import annotations

import abc
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request

from lab.apiserver import ApiServer
from lab.kubernetes import binaries, pki

READY_TIMEOUT = 90.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ApiEndpoint(abc.ABC):
    """What a parity test needs of a server; `name` is the test id ("lab" or "kube-apiserver")."""

    name = ""
    kubeconfig = ""

    @abc.abstractmethod
    def restart(self) -> None:
        """Stop and start the API server process (its storage survives)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every process of the server."""


class LabApi(ApiEndpoint):
    name = "lab"

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.state = os.path.join(directory, "state.json")
        self.port = free_port()
        self.server = self._start()
        self.kubeconfig = os.path.join(directory, "kubeconfig")
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "lab",
            "clusters": [{"name": "lab", "cluster": {"server": self.server.url}}],
            "users": [{"name": "agent", "user": {"token": "lab-token"}}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "agent"}}],
        }
        with open(self.kubeconfig, "w") as f:
            json.dump(config, f)

    def _start(self) -> ApiServer:
        server = ApiServer(state_file=self.state)  # the defaults `python -m lab.apiserver` runs with
        server.start(host="127.0.0.1", port=self.port)
        return server

    def restart(self) -> None:
        self.server.stop()
        self.server = self._start()

    def close(self) -> None:
        self.server.stop()


class RealApi(ApiEndpoint):
    name = "kube-apiserver"

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.bin_dir = binaries.ensure_built()
        self.pki = pki.Pki(os.path.join(directory, "pki"))
        self.pki.ensure_ca()
        self.pki.server("apiserver", dns=["localhost"], ips=[ipaddress.ip_address("127.0.0.1")])
        self.port, etcd_client, etcd_peer = free_port(), free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{etcd_client}"
        self.url = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = self.pki.kubeconfig(os.path.join(directory, "admin.kubeconfig"), server=self.url,
                                              name="admin", identity=pki.ADMIN)
        self.etcd_argv = [
            os.path.join(self.bin_dir, "etcd"), "--name", "parity", "--data-dir", os.path.join(directory, "etcd"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-cluster", f"parity=http://127.0.0.1:{etcd_peer}", "--unsafe-no-fsync", "--log-level", "warn"]
        self.etcd: subprocess.Popen | None = None
        self.apiserver: subprocess.Popen | None = None
        try:
            self.etcd = self._spawn(self.etcd_argv, "etcd")
            self.apiserver = self._spawn(self.apiserver_argv(), "kube-apiserver")
            self.wait_ready()
        except BaseException:
            self.close()
            raise

    def apiserver_argv(self) -> list[str]:
        p = self.pki
        sa_key, sa_pub = p.service_account_keys()
        return [os.path.join(self.bin_dir, "kube-apiserver"), "--etcd-servers", self.etcd_url,
                "--bind-address", "127.0.0.1", "--secure-port", str(self.port), "--advertise-address", "127.0.0.1",
                "--tls-cert-file", p.path("apiserver.crt"), "--tls-private-key-file", p.path("apiserver.key"),
                "--client-ca-file", p.ca_cert, "--service-account-issuer", "https://kubernetes.default.svc",
                "--service-account-key-file", sa_pub, "--service-account-signing-key-file", sa_key,
                "--service-cluster-ip-range", "10.250.0.0/24", "--authorization-mode", "RBAC",
                "--cert-dir", os.path.join(self.directory, "certs"), "--endpoint-reconciler-type", "none",
                "--profiling=false", "--v=1"]

    def _spawn(self, argv: list[str], name: str) -> subprocess.Popen:
        log = open(os.path.join(self.directory, f"{name}.log"), "ab")
        try:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        finally:
            log.close()

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.pki.ca_cert)
        cert, key = self.pki.client("admin", pki.ADMIN)
        context.load_cert_chain(cert, key)
        return context

    def log_tail(self, name: str) -> str:
        with open(os.path.join(self.directory, f"{name}.log"), errors="replace") as f:
            return "".join(f.readlines()[-30:])

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        context = self.ssl_context()
        last = ""
        while time.monotonic() < deadline:
            for name, process in (("etcd", self.etcd), ("kube-apiserver", self.apiserver)):
                if process is None or process.poll() is not None:
                    raise RuntimeError(f"{name} exited:\n{self.log_tail(name)}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", context=context, timeout=5) as response:
                    if response.status == 200:
                        return
            except Exception as error:  # noqa: BLE001 (not up yet: refused, 500 while hooks run)
                last = str(error)
            time.sleep(0.3)
        raise RuntimeError(f"kube-apiserver not ready in {READY_TIMEOUT:.0f} s ({last}):\n"
                           f"{self.log_tail('kube-apiserver')}")

    @staticmethod
    def _stop(process: subprocess.Popen | None) -> None:
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

    def restart(self) -> None:
        self._stop(self.apiserver)
        self.apiserver = self._spawn(self.apiserver_argv(), "kube-apiserver")
        self.wait_ready()

    def close(self) -> None:
        self._stop(self.apiserver)
        self._stop(self.etcd)


def start(name: str) -> ApiEndpoint:
    directory = tempfile.mkdtemp(prefix=f"na-parity-{name}-", dir="/tmp")
    try:
        return LabApi(directory) if name == "lab" else RealApi(directory)
    except BaseException:  # (RealApi stopped what it started)
        shutil.rmtree(directory, ignore_errors=True)
        raise


def remove(endpoint: ApiEndpoint) -> None:
    try:
        endpoint.close()
    finally:
        shutil.rmtree(getattr(endpoint, "directory"), ignore_errors=True)
