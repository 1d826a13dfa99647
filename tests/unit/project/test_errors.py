"""One exception root: every public exception class of ours derives from `NetagentError`, and
the CLI turns any of them into a message and exit code 1 in one place."""
from __future__ import annotations

import ast
import builtins
import errno
from pathlib import Path

from netagent.cli import main as cli_main
from netagent.errors import NetagentError

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("netagent", "cni", "proxy", "ebpf")
BUILTIN_EXCEPTIONS = {name for name, value in vars(builtins).items()
                      if isinstance(value, type) and issubclass(value, BaseException)}


def _exception_classes_outside_the_root() -> list[str]:
    """Public classes whose bases are only builtin exceptions (private ones are control flow)."""
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "lab" in path.relative_to(ROOT).parts:
                continue   # the lab is a client of the product, with errors of its own
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                    continue
                bases = {base.id for base in node.bases if isinstance(base, ast.Name)}
                if bases and bases <= BUILTIN_EXCEPTIONS and node.name != "NetagentError":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}")
    return found


def test_every_exception_of_ours_derives_from_netagent_error():
    assert _exception_classes_outside_the_root() == []


def test_the_old_bases_stay_for_their_callers():
    from cni.wire import WireError
    from ebpf.syscall import BpfError
    from netagent.kernel.iptables.runner import IptablesError
    from proxy.kube_objects import MalformedObject
    assert issubclass(BpfError, OSError) and issubclass(BpfError, NetagentError)
    assert issubclass(MalformedObject, ValueError) and issubclass(IptablesError, RuntimeError)
    assert issubclass(WireError, NetagentError)
    assert BpfError(2, "gone").errno == 2


def test_one_kernel_error_for_both_netlink_seams():
    """The CNI plugin's kernel and node routing's raise the same class; each keeps its words."""
    from cni.kernel import LinkExists
    from netagent.kernel.errors import KernelError
    from netagent.noderoutes.routing.model import kernel_error
    assert issubclass(KernelError, NetagentError) and issubclass(LinkExists, KernelError)
    routing = kernel_error(errno.ENODEV, "no device na-vxlan")
    assert type(routing) is KernelError and routing.code == errno.ENODEV
    assert str(routing) == f"no device na-vxlan (errno {errno.ENODEV})"
    plugin = KernelError(errno.EEXIST, "File exists: route 10.244.1.0/24")
    assert (plugin.code, str(plugin)) == (errno.EEXIST, "File exists: route 10.244.1.0/24")
    assert (LinkExists("na0123456789ab").code, str(LinkExists("na0123456789ab"))) == (errno.EEXIST, "File exists")


def test_the_cli_reports_an_error_of_ours_once(tmp_path, capsys):
    code = cli_main(["cni", "install", "--bin-dir", str(tmp_path / "bin"), "--conf-dir", str(tmp_path / "conf"),
                     "--shim", "/bin/true"])
    assert code == 1
    assert capsys.readouterr().err.strip() == "netagent cni install: a network config needs at least one --subnet"


def test_the_cli_reports_a_system_error_the_same_way(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = cli_main(["cni", "install", "--bin-dir", str(blocker / "bin"), "--shim", "/bin/true"])
    assert code == 1
    assert capsys.readouterr().err.startswith("netagent cni install: ")


def test_the_cli_imports_command_modules_only_when_they_run():
    """At module level cli.py imports only the version, the defaults, the error root, owned
    names and the pod attachment enum (flag choices): each command's module is imported inside
    the function that runs it."""
    tree = ast.parse((ROOT / "netagent" / "cli.py").read_text())
    top = {node.module for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert top <= {"__future__", "netagent", "netagent.cniserver.defaults", "netagent.errors", "netagent.kernel",
                   "netagent.kernel.pod_attachment"}
