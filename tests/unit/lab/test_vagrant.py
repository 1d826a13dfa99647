"""The Vagrantfile and the project's shell scripts, checked without running them.

- `shellcheck` on `scripts/vagrant/*.sh` (every severity) and on the other shell scripts in
  `scripts/`, `cni/shim/` and `deploy/` (found by their `#!`): every severity too, except
  `scripts/setup.sh` at `warning` (its one finding is SC2012, info: `ls | sort -V` over
  `/usr/src/linux-headers-*`, names without blanks).
- `vagrant validate` on a copy of the Vagrantfile and `scripts/vagrant/` in a temporary
  directory (the Vagrantfile writes `.vagrant/kubeadm-token` beside itself; the repository is
  left alone), with `--ignore-provider` (Debian's vagrant installed without recommends has
  neither VirtualBox nor vagrant-libvirt). It checks every provisioner's `path:` exists.
- The Vagrantfile's provisioning is the scripts', each with a header and `set -euo pipefail`;
  no host venv, no raw `podman build`; the deploy/README.md sections it names exist;
  `manifest.sh` reads the image and pod network from the real manifest and adds `--iface`
  right after `--backend` (what tests/unit/deploy/test_deploy_manifests.py checked of the inline
  shell before).

Each tool's test skips, saying why, when the tool is not installed (`scripts/setup.sh`
installs both).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
VAGRANTFILE = REPO / "Vagrantfile"
VAGRANT_SCRIPTS = REPO / "scripts" / "vagrant"
MANIFEST = REPO / "deploy" / "netagent.yaml"
# Checked at shellcheck's `warning` severity instead of every one (see the module docstring).
WARNING_ONLY = {REPO / "scripts" / "setup.sh"}


def vagrant_scripts() -> list[Path]:
    return sorted(VAGRANT_SCRIPTS.glob("*.sh"))


def other_shell_scripts() -> list[Path]:
    found = []
    for folder in ("scripts", "cni/shim", "deploy"):
        for path in sorted((REPO / folder).rglob("*")):
            if not path.is_file() or path.parent == VAGRANT_SCRIPTS:
                continue
            with path.open("rb") as f:
                first = f.readline()
            if re.match(rb"#!\s*/(usr/)?bin/(env\s+)?(ba)?sh\b", first):
                found.append(path)
    return found


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (apt-get install --no-install-recommends {tool}; "
                    "scripts/setup.sh installs it)")
    return path


def shellcheck(paths: list[Path], *options: str) -> None:
    result = subprocess.run([need("shellcheck"), "--format=gcc", *options, *map(str, paths)],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_vagrant_scripts():
    assert vagrant_scripts(), "no scripts in scripts/vagrant/"
    shellcheck(vagrant_scripts(), "--shell=bash")


def test_shellcheck_other_shell_scripts():
    scripts = other_shell_scripts()
    names = {path.relative_to(REPO).as_posix() for path in scripts}
    assert {"scripts/build-image", "scripts/make-base-image", "scripts/setup.sh",
            "cni/shim/build.sh"} <= names, names
    shellcheck([path for path in scripts if path not in WARNING_ONLY])
    shellcheck(sorted(WARNING_ONLY), "--severity=warning")


def test_vagrant_validate(tmp_path):
    vagrant = need("vagrant")
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy2(VAGRANTFILE, tree / "Vagrantfile")
    shutil.copytree(VAGRANT_SCRIPTS, tree / "scripts" / "vagrant")
    env = {**os.environ, "VAGRANT_CWD": str(tree), "VAGRANT_HOME": str(tmp_path / "vagrant.d"),
           "VAGRANT_CHECKPOINT_DISABLE": "1", "VAGRANT_NO_COLOR": "1"}
    result = subprocess.run([vagrant, "validate", "--ignore-provider"], cwd=tree, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "validated successfully" in result.stdout
    for machine in ("cp", "worker1", "worker2"):
        assert f"{machine}:" in result.stdout


def test_vagrantfile_provisions_with_the_scripts_only():
    text = VAGRANTFILE.read_text()
    assert "<<~" not in text and "inline:" not in text, "provisioning belongs in scripts/vagrant/"
    referenced = set(re.findall(r'path: "(scripts/vagrant/[^"]+)"', text))
    called = {f"scripts/vagrant/{name}" for script in vagrant_scripts()
              for name in re.findall(r"scripts/vagrant/([\w.-]+\.sh)", script.read_text())}
    on_disk = {path.relative_to(REPO).as_posix() for path in vagrant_scripts()}
    assert referenced | called == on_disk


@pytest.mark.parametrize("script", vagrant_scripts(), ids=lambda path: path.name)
def test_vagrant_script_shape(script):
    lines = script.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert lines[1].startswith("# ") and len(lines[1]) > 20, "a header comment says what it does"
    assert "set -euo pipefail" in lines, "set -euo pipefail"
    assert os.access(script, os.X_OK)


def test_no_host_venv_and_the_image_from_build_image():
    texts = [VAGRANTFILE.read_text()] + [path.read_text() for path in vagrant_scripts()]
    everything = "\n".join(texts)
    for gone in ("python3-venv", "-m venv", "/opt/netagent/venv", "pip install", "podman build",
                 "LAB-ONLY", "Known limitation"):
        assert gone not in everything, gone
    image = (VAGRANT_SCRIPTS / "image.sh").read_text()
    assert '"$src/scripts/build-image"' in image
    assert "ctr -n k8s.io images import" in image
    assert "kubectl apply -f -" in (VAGRANT_SCRIPTS / "control-plane.sh").read_text()


def test_named_readme_sections_exist():
    """Each quoted phrase in a sentence of a comment that names deploy/README.md is one of its
    headings."""
    headings = {line.lstrip("#").strip() for line in
                (REPO / "deploy" / "README.md").read_text().splitlines() if line.startswith("#")}
    named = []
    for path in [VAGRANTFILE, *vagrant_scripts()]:
        text = re.sub(r"\n#\s*", " ", path.read_text())    # a comment block as one line
        for sentence in re.findall(r"deploy/README\.md(.*?)(?:[.;](?:\s|$)|$)", text, re.MULTILINE):
            named += re.findall(r'"([^"]+)"', sentence)
    assert len(named) >= 6, named
    missing = [section for section in named if section not in headings]
    assert not missing, missing


def manifest_sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(VAGRANT_SCRIPTS / "manifest.sh"), *args],
                          env={**os.environ, "NETAGENT_SRC": str(REPO)},
                          capture_output=True, text=True, timeout=30)


def manifest_documents(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def pod_spec(documents: list[dict]) -> dict:
    daemonset = next(doc for doc in documents if doc["kind"] == "DaemonSet")
    return daemonset["spec"]["template"]["spec"]


def agent_args(documents: list[dict]) -> list[str]:
    return next(c for c in pod_spec(documents)["containers"] if c["name"] == "netagent")["args"]


def test_the_lab_takes_image_and_pod_network_from_the_manifest():
    documents = manifest_documents(MANIFEST.read_text())
    spec = pod_spec(documents)
    images = {c["image"] for c in spec["containers"] + spec["initContainers"]}
    assert manifest_sh("image").stdout.splitlines() == sorted(images)    # one image
    (cidr,) = [arg.split("=", 1)[1] for arg in agent_args(documents)
               if arg.startswith("--cluster-cidr=")]
    assert manifest_sh("cluster-cidr").stdout == f"{cidr}\n"
    control_plane = (VAGRANT_SCRIPTS / "control-plane.sh").read_text()
    assert 'cluster_cidr=$("$src/scripts/vagrant/manifest.sh" cluster-cidr)' in control_plane
    assert '--pod-network-cidr="$cluster_cidr" --skip-phases=addon/kube-proxy' in control_plane
    image = (VAGRANT_SCRIPTS / "image.sh").read_text()
    assert 'image=$("$src/scripts/vagrant/manifest.sh" image)' in image
    assert '--tag "$image"' in image


def test_manifest_sh_adds_iface_right_after_backend():
    result = manifest_sh("with-iface", "enp0s8")
    assert result.returncode == 0, result.stderr
    original = manifest_documents(MANIFEST.read_text())
    changed = manifest_documents(result.stdout)
    before, after = agent_args(original), agent_args(changed)
    backend = next(i for i, arg in enumerate(before) if arg.startswith("--backend="))
    assert after == before[:backend + 1] + ["--iface=enp0s8"] + before[backend + 1:]
    agent_args(changed).remove("--iface=enp0s8")
    assert changed == original, "nothing else changes"


@pytest.mark.parametrize("args", [("with-iface", "eth1|x"), ("with-iface",), ("bogus",), ()])
def test_manifest_sh_refuses_bad_arguments(args):
    result = manifest_sh(*args)
    assert result.returncode == 2
    assert result.stdout == ""
