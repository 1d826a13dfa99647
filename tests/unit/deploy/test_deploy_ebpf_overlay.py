"""deploy/ebpf/ must build, with the real kubectl's kustomize, into the base manifest plus exactly
what the eBPF proxy needs: its image, privileged, its three host mounts and its flags, which the
real CLI parses. The base's own checks: test_deploy_manifests.py."""
from __future__ import annotations

import functools
import subprocess
import tomllib
from pathlib import Path

import yaml

from lab.kubernetes.cluster import kubectl_binary
from netagent.cli import build_parser

REPO = Path(__file__).resolve().parents[3]
OVERLAY = REPO / "deploy" / "ebpf"
BASE = REPO / "deploy" / "netagent.yaml"


@functools.cache
def built() -> tuple[dict, ...]:
    proc = subprocess.run([kubectl_binary(), "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


def daemonset(documents) -> dict:
    (found,) = [d for d in documents if d["kind"] == "DaemonSet"]
    return found


def agent(documents) -> dict:
    return daemonset(documents)["spec"]["template"]["spec"]["containers"][0]


def test_the_link_and_the_base_are_one_file():
    assert BASE.is_symlink() and BASE.resolve() == REPO / "deploy" / "base" / "netagent.yaml"


def test_every_object_but_the_daemonset_is_the_bases():
    base = [d for d in yaml.safe_load_all(BASE.read_text()) if d]
    key = lambda d: (d["kind"], d["metadata"]["name"])   # noqa: E731
    assert sorted(map(key, built())) == sorted(map(key, base))
    others = {key(d): d for d in base if d["kind"] != "DaemonSet"}
    assert {key(d): d for d in built() if d["kind"] != "DaemonSet"} == others


def test_the_agent_runs_the_ebpf_image_privileged():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    spec = daemonset(built())["spec"]["template"]["spec"]
    images = {c["image"] for c in [*spec["containers"], *spec["initContainers"]]}
    assert images == {f"localhost/netagent:{version}-ebpf"}   # what `scripts/build-image --ebpf` tags
    assert agent(built())["securityContext"] == {"privileged": True}


def test_the_flags_parse_with_the_real_cli_and_name_the_mounts():
    container = agent(built())
    argv = [a.replace("$(NODE_NAME)", "node-a") for a in container["args"]]
    args = build_parser().parse_args(argv)
    assert (args.proxy_mode, args.bpf_nodeport_device) == ("ebpf", "auto")
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in daemonset(built())["spec"]["template"]["spec"]["volumes"]
               if "hostPath" in v}
    assert volumes[mounts[args.bpf_root]] == "/sys/fs/bpf"
    assert volumes[mounts[args.cgroup_root]] == "/sys/fs/cgroup"
    assert volumes[mounts["/usr/src"]] == "/usr/src"   # the kernel headers bcc compiles against
    assert volumes[mounts["/lib/modules"]] == "/lib/modules"
    assert sum(a.startswith("--proxy-mode") for a in argv) == 1
