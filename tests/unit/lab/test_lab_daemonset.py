"""lab/daemonset.py: deploy/netagent.yaml's pod rendered for a lab node, as a kubelet would.

Pure: the real manifest in, the containers' args, env, mounts and probes out, and the
`podman run` argv each becomes; plus agent_pods' hostPath checks, in a temporary directory.
The deploy tier (tests/deploy) runs the containers.
"""
from __future__ import annotations

import os

import pytest

from lab import daemonset
from lab.agent_pods import ensure_host_path
from lab.daemonset import NodeHost, ProbeKind, Propagation
from lab.state import LabError

MANIFEST = os.path.join(os.path.dirname(__file__), "..", "..", "..",  "deploy", "netagent.yaml")
NODE = NodeHost(name="node-7", netns="lab-n7", address="198.18.16.7", root="/lab/nodes/node-7/root")
FLAGS = {"--backend": "host-gw", "--proxy-mode": "none"}


def render(**overrides):
    kwargs = dict(node=NODE, image="localhost/netagent:next", kubeconfig="/lab/kubeconfig", agent_flags=FLAGS,
                  config_maps={})
    kwargs.update(overrides)
    return daemonset.render_pod(daemonset.load_daemonset(MANIFEST), **kwargs)


def agent(pod):
    (container,) = [c for c in pod.containers if c.name == "netagent"]
    return container


def test_pod_is_named_for_the_node_and_runs_in_its_network():
    pod = render()
    assert (pod.name, pod.namespace, pod.host_network, pod.grace_period) == ("netagent-node-7", "kube-system", True, 30)
    argv = daemonset.podman_run_argv(agent(pod), pod=pod, node=NODE, name="c", labels={"k": "v"}, detach=True,
                                     log_path="/lab/agent.log")
    assert argv[argv.index("--network") + 1] == "ns:/run/netns/lab-n7"
    assert "--privileged" not in argv and "--detach" in argv and argv[argv.index("--pull") + 1] == "never"
    assert argv[argv.index("--cap-drop") + 1] == "all"   # the manifest's capabilities, nothing else
    assert {argv[i + 1] for i, a in enumerate(argv) if a == "--cap-add"} == {"NET_ADMIN", "NET_RAW", "SYS_ADMIN"}
    assert argv[argv.index("--security-opt") + 1] == "no-new-privileges"
    assert argv[-len(agent(pod).args) - 1:] == ["localhost/netagent:next", *agent(pod).args]


def test_args_expand_the_downward_api_and_carry_the_operators_edits():
    args = agent(render()).args
    assert args[0] == "run" and "--node-name=node-7" in args
    assert "--backend=host-gw" in args and "--proxy-mode=none" in args
    assert not any(a.startswith("--backend=vxlan") for a in args)
    assert agent(render()).env["NODE_NAME"] == "node-7"
    assert agent(render()).env["KUBECONFIG"] == daemonset.KUBECONFIG_IN_CONTAINER
    (init,) = render().init_containers
    assert init.args[:2] == ["cni", "install"] and "--backend=host-gw" not in init.args


def test_host_paths_are_the_nodes_own_except_the_pod_namespace_pins():
    mounts = {m.container: m for m in agent(render()).mounts}
    assert mounts["/run/netagent"].host == "/lab/nodes/node-7/root/run/netagent"
    assert mounts["/host/etc/cni/net.d"].host == "/lab/nodes/node-7/root/etc/cni/net.d"
    assert mounts["/run/xtables.lock"].host_type == "FileOrCreate"
    assert mounts["/opt/cni/bin"].read_only and mounts["/opt/cni/bin"].volume_option().startswith(
        "/lab/nodes/node-7/root/opt/cni/bin:/opt/cni/bin:ro,")
    assert mounts["/run/netns"].host == "/run/netns"
    assert mounts["/run/netns"].propagation is Propagation.HOST_TO_CONTAINER
    assert mounts["/run/netns"].volume_option() == "/run/netns:/run/netns:rw,rslave"
    assert mounts[daemonset.KUBECONFIG_IN_CONTAINER].read_only
    container = agent(render())
    assert daemonset.host_path_of(container, "/run/netagent/cni.sock") == "/lab/nodes/node-7/root/run/netagent/cni.sock"
    with pytest.raises(LabError):
        daemonset.host_path_of(container, "/etc/passwd")


def test_probes_come_from_the_manifest():
    probes = agent(render()).probes
    assert set(probes) == set(ProbeKind)
    startup = probes[ProbeKind.STARTUP]
    assert (startup.port, startup.path, startup.period, startup.failure_threshold) == (10258, "/healthz", 5.0, 36)


def test_config_maps_feed_env_from_and_none_skips_them():
    assert agent(render(config_maps={"netagent-apiserver": {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}})).env[
        "KUBERNETES_SERVICE_HOST"] == "10.0.0.1"
    assert "KUBERNETES_SERVICE_HOST" not in agent(render(config_maps=None)).env


@pytest.mark.parametrize("text, expected", [
    ("--node-name=$(NODE_NAME)", "--node-name=node-7"),
    ("$$(NODE_NAME)", "$(NODE_NAME)"),
    ("$(UNDEFINED)", "$(UNDEFINED)"),
])
def test_expand_references_as_the_kubelet(text, expected):
    assert daemonset.expand_references(text, {"NODE_NAME": "node-7"}) == expected


def test_with_flag_replaces_either_spelling_or_appends():
    assert daemonset.with_flag(["run", "--backend", "vxlan", "--x=1"], "--backend", "ipip") == [
        "run", "--backend=ipip", "--x=1"]
    assert daemonset.with_flag(["run", "--backend=vxlan"], "--backend", "ipip") == ["run", "--backend=ipip"]
    assert daemonset.with_flag(["run"], "--backend", "ipip") == ["run", "--backend=ipip"]
    assert daemonset.flag_value(["run", "--cni-socket", "/s"], "--cni-socket") == "/s"


def test_a_switch_is_there_bare_exactly_when_asked():
    manifest_args = ["run", "--network-policy", "--proxy-mode=iptables"]
    assert daemonset.with_flag(manifest_args, "--network-policy", False) == ["run", "--proxy-mode=iptables"]
    assert daemonset.with_flag(manifest_args, "--network-policy", True) == ["run", "--proxy-mode=iptables",
                                                                              "--network-policy"]
    assert daemonset.with_flag(["run"], "--network-policy", True) == ["run", "--network-policy"]


def test_what_the_lab_cannot_run_is_refused_plainly(tmp_path):
    manifest = tmp_path / "ds.yaml"
    manifest.write_text("kind: Service\n")
    with pytest.raises(LabError, match="0 DaemonSets"):
        daemonset.load_daemonset(str(manifest))
    ds = daemonset.load_daemonset(MANIFEST)
    ds["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations"}}})
    with pytest.raises(LabError, match="fieldRef"):
        daemonset.render_pod(ds, node=NODE, image="i", kubeconfig="k", agent_flags={}, config_maps={})
    with pytest.raises(LabError, match="not absolute"):
        daemonset.host_path_on_node(NODE, "relative/path")


def test_ensure_host_path_creates_and_checks_as_the_kubelet(tmp_path):
    ensure_host_path(str(tmp_path / "d" / "e"), "DirectoryOrCreate")
    ensure_host_path(str(tmp_path / "f" / "lock"), "FileOrCreate")
    assert (tmp_path / "d" / "e").is_dir() and (tmp_path / "f" / "lock").is_file()
    with pytest.raises(LabError):
        ensure_host_path(str(tmp_path / "missing"), "Directory")
    with pytest.raises(LabError):
        ensure_host_path(str(tmp_path / "d"), "Socket")


def test_security_contexts_become_podman_options_and_unknown_fields_are_refused():
    security = daemonset.security_of
    assert security({"name": "c", "securityContext": {"privileged": True}}).podman_options() == ["--privileged"]
    assert security({"name": "c", "securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
                                                       "allowPrivilegeEscalation": False}}).podman_options() == [
        "--cap-drop", "all", "--cap-add", "NET_ADMIN", "--security-opt", "no-new-privileges"]
    assert security({"name": "c"}).podman_options() == []   # the runtime's defaults
    with pytest.raises(LabError, match="seccompProfile"):
        security({"name": "c", "securityContext": {"seccompProfile": {"type": "Unconfined"}}})
    (init,) = render().init_containers
    assert init.security.podman_options() == ["--cap-drop", "all", "--security-opt", "no-new-privileges"]
