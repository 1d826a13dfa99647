"""Fixtures for tests that build real namespaces: a lab node with or without its agent.

Every fixture removes what it built, and a final check per test asserts that no namespace
the test made and no interface of ours in the root namespace outlived it.
"""
import os
import re
import subprocess

import pytest

from lab import LabNode
from netagent.kernel import namespaces
from netagent.kernel.iptables.backend import IptablesBackend
from tests.conftest import require_root_netns

PREFIX = "na-t"


def ours_in_root_namespace() -> list:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names = [line.split(": ")[1].split("@")[0] for line in out.splitlines() if ": " in line]
    return [n for n in names if n == "na0" or re.fullmatch(r"na[0-9a-f]{12}", n)]


@pytest.fixture(autouse=True)
def _root_and_no_leaks(monkeypatch):
    """Every namespace this test made is gone, and no interface of ours appeared in the root
    namespace. Only the namespaces made through `namespaces.create` in this process are the
    test's: other suites on a shared machine make (and remove) `na-t` namespaces at any time."""
    require_root_netns()
    made: list[str] = []
    create = namespaces.create

    def recording(name: str) -> str:
        made.append(name)
        return create(name)

    monkeypatch.setattr(namespaces, "create", recording)
    in_root_before = set(ours_in_root_namespace())
    yield
    leaked = sorted(name for name in set(made) if os.path.exists(namespaces.netns_path(name)))
    assert not leaked, f"namespaces leaked: {leaked}"
    appeared = sorted(set(ours_in_root_namespace()) - in_root_before)
    assert not appeared, f"an interface of ours appeared in the root namespace: {appeared}"


@pytest.fixture(params=["agent", "in-process"])
def where(request):
    return request.param


@pytest.fixture
def make_node():
    nodes = []

    def make(**kwargs):
        kwargs.setdefault("prefix", PREFIX)
        node = LabNode(**kwargs).__enter__()
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()


@pytest.fixture(params=[IptablesBackend.LEGACY, IptablesBackend.NFT], ids=lambda b: b.value)
def backend(request):
    """Each iptables test runs on both backends the host may use."""
    return request.param


@pytest.fixture
def netns():
    """One empty namespace of the test's own, removed afterwards."""
    name = namespaces.unique_name(f"{PREFIX}-ns")
    namespaces.create(name)
    try:
        yield name
    finally:
        namespaces.remove(name)
