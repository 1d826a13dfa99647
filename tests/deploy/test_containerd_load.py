"""deploy/README's "load it on the nodes" step with a real containerd: the image saved by
podman as a docker archive, imported with `ctr images import`, then run by containerd's runc.

The containerd is the e2e tier's throwaway node (tests/e2e/containerd_harness.py: its own
root, state, sockets, network namespace and private mount namespaces), so nothing of this
machine's containerd or network is touched; the container runs in a new network namespace
of its own, without CNI.
"""
from __future__ import annotations

import pytest

from lab.agent_pods import run_podman
from tests.e2e.containerd_harness import ContainerdNode, ImageArchive, missing_prerequisites

pytestmark = pytest.mark.deploy


def test_ctr_imports_the_saved_image_and_runs_it(agent_image, tmp_path):
    missing = missing_prerequisites()
    if missing:
        pytest.skip("; ".join(missing))
    archive = tmp_path / "netagent.tar"
    run_podman(["save", "--format", "docker-archive", "-o", str(archive), agent_image], timeout=300)
    empty = tmp_path / "empty"
    empty.mkdir()
    with ContainerdNode(cni_bin_dir=empty, cni_conf_dir=empty, image=ImageArchive(path=archive, refs=(agent_image,)),
                        name_prefix="na-td-ctr", timeout=300) as node:
        listed = node.ctr(["images", "ls", "--quiet"]).stdout.split()
        assert agent_image in listed, listed
        assert node.tmp_dir is not None
        ran = node.ctr(["run", "--rm", "--fifo-dir", str(node.tmp_dir / "fifo"), agent_image, "version-check",
                        "/opt/netagent/venv/bin/netagent", "--version"], cni_view=True)
        assert ran.stdout.strip() == "netagent 0.1.0", ran
