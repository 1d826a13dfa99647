"""The cluster tier: lab clusters (API server, agents, pods) in namespaces, as root.

A cluster takes seconds to build, so tests that only read share one per module; tests that
break things (kill agents, stop the API server) build their own. Every cluster is removed
by its fixture, and each module ends with a check that no namespace of ours outlived it.
"""
import pytest

from tests.cluster.lab_tools import our_namespaces
from tests.conftest import require_root_netns


@pytest.fixture(scope="module", autouse=True)
def _no_leaks_per_module():
    require_root_netns()
    yield
    assert not our_namespaces(), f"namespaces leaked: {our_namespaces()}"
