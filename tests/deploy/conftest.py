"""The deploy tier: the image built by scripts/build-image, run as deploy/netagent.yaml says.

Needs root and podman (scripts/setup.sh installs it); without podman every test here is
skipped and says so. The session builds the image once (`scripts/build-image --if-stale`: a
build only when the image's source digest differs from the checkout's; on a fresh machine
the local Debian base is made first) and a second image derived from it for the upgrade
test. Every lab is removed by its fixture, and each module ends by checking that no
namespace and no container of ours outlived it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from lab.agent_pods import run_podman
from tests.cluster import lab_tools
from tests.cluster.lab_tools import ROOT
from tests.conftest import require_root_netns

# Tags name this checkout (another checkout's run on the machine builds its own source) and
# the rollout's image this process (another run's session end removes its own).
IMAGE = os.environ.get("NETAGENT_TEST_IMAGE",
                       f"localhost/netagent:lab-test-{hashlib.sha256(ROOT.encode()).hexdigest()[:8]}")
NEXT_IMAGE = f"{IMAGE}-next-{os.getpid()}"
PREFIX = "na-td"  # not the cluster tier's: its tests may run at the same time


def deploy_lab(**kwargs):
    return lab_tools.lab_cluster(prefix=PREFIX, **kwargs)


def our_namespaces() -> list:
    return [name for name in lab_tools.our_namespaces() if name.startswith(PREFIX + "-")]


def require_podman() -> None:
    require_root_netns()
    if not shutil.which("podman"):
        pytest.skip("podman is not installed (scripts/setup.sh installs it): the deploy tier runs the image with it")


def our_containers() -> list[str]:
    """Containers of the labs this process made (another run's labs share PREFIX, not the id)."""
    return lab_tools.ours(run_podman(["ps", "--all", "--format", "{{.Names}}"]).stdout.split())


@pytest.fixture(scope="session")
def agent_image() -> str:
    """The project's image for the checkout's source (built now if it is not)."""
    require_podman()
    started = time.monotonic()
    proc = subprocess.run([os.path.join(ROOT, "scripts", "build-image"), "--if-stale", "--tag", IMAGE],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(f"scripts/build-image failed:\n{proc.stderr[-4000:]}")
    print(f"agent image {IMAGE} ready in {time.monotonic() - started:.1f} s")
    return IMAGE


@pytest.fixture(scope="session")
def next_image(agent_image) -> str:
    """Another image of the agent (what a rollout moves to): derived from the first, so it is a
    different image with the same code; removed at the end of the session."""
    with tempfile.TemporaryDirectory() as context:
        with open(os.path.join(context, "Containerfile"), "w") as f:
            f.write(f"FROM {agent_image}\nLABEL netagent.test-revision=next\nENV NETAGENT_TEST_REVISION=next\n")
        run_podman(["build", "--network", "host", "--pull=never", "-t", NEXT_IMAGE, context])
    yield NEXT_IMAGE
    run_podman(["rmi", NEXT_IMAGE], check=False)


@pytest.fixture(scope="module", autouse=True)
def _no_leaks_per_module():
    require_podman()
    yield
    assert not our_containers(), f"containers leaked: {our_containers()}"
    assert not our_namespaces(), f"namespaces leaked: {our_namespaces()}"
