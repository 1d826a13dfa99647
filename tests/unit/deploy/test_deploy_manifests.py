"""deploy/ must agree with the code it ships.

Nothing here can run a cluster or build an image, so these tests check what can be checked
offline, against the real code rather than against copies of it:
- every object in deploy/netagent.yaml survives a round trip through the official client's
  models (a misspelled or misplaced field is dropped by the models, so the trip shows it);
- the container arguments parse with `netagent.cli.build_parser()`, so renaming a flag
  breaks this test instead of a rollout;
- the paths the agent writes into the network config (socket, IPAM data directory) are
  mounted at the same path on the host, where the runtime's plugin reads them;
- RBAC grants exactly what the agent's API calls need, read from the code (`api_calls.py`):
  cluster-wide in the ClusterRole, and what the code reads as one named object (the topology
  ConfigMap) in a Role of its namespace naming it alone;
- the ValidatingAdmissionPolicy that keeps each agent to its own Node is bound, denies, fails
  closed and keys on the node name Kubernetes puts in a pod-bound token (the real API server
  judges it in tests/kubernetes/test_least_privilege.py);
- the Containerfile copies every package folder pyproject.toml declares but the lab, installs
  them into a venv and ends in the `netagent` console script.
The Vagrant lab's agreement with the manifest: tests/unit/lab/test_vagrant.py.
"""
from __future__ import annotations

import argparse
import copy
import functools
import re
import shlex
import threading
import tomllib
from pathlib import Path, PurePosixPath

import pytest
import yaml

from netagent.cli import build_parser
from netagent.daemon.bgp_start import DEFAULT_CONFIG
from netagent.kube.resources import CONFIG_MAPS, NODES
from tests.unit.project.api_calls import UnclassifiedCall, call_sites, permissions_by_scope, permissions_in, permissions_used

REPO = Path(__file__).resolve().parents[3]
MANIFEST = REPO / "deploy" / "netagent.yaml"
CONTAINERFILE = REPO / "deploy" / "Containerfile"
SAMPLE_NODE_NAME = "node-a"
# k8s.io/apiserver pkg/authentication/serviceaccount/util.go, NodeNameKey: the extra info a
# pod-bound ServiceAccount token carries (ServiceAccountTokenPodNodeInfo, Kubernetes >= 1.32)
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
KINDS = ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "Role", "RoleBinding", "ServiceAccount",
         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]


# ------------------------------------------------------------------ manifest helpers
@functools.cache
def _parsed_manifest() -> tuple[dict, ...]:
    return tuple(doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc)


def load_manifest() -> list[dict]:
    """Fresh copies each call: a test may change what it gets."""
    return copy.deepcopy(list(_parsed_manifest()))


def objects_of_kind(kind: str) -> list[dict]:
    return [doc for doc in load_manifest() if doc["kind"] == kind]


def the_daemonset() -> dict:
    (daemonset,) = objects_of_kind("DaemonSet")
    return daemonset


def pod_spec() -> dict:
    return the_daemonset()["spec"]["template"]["spec"]


def agent_container() -> dict:
    (container,) = [c for c in pod_spec()["containers"] if c["name"] == "netagent"]
    return container


def expand_env_references(args: list[str], env: list[dict], *, values: dict[str, str]) -> list[str]:
    """Expand `$(VAR)` as the kubelet does; every VAR must be declared in the container's env."""
    declared = {entry["name"] for entry in env}

    def substitute(match: re.Match) -> str:
        name = match.group(1)
        assert name in declared, f"$({name}) is used in args but not declared in the container's env"
        return values[name]
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", substitute, arg) for arg in args]


def parsed_agent_args():
    container = agent_container()
    args = expand_env_references(container["args"], container.get("env", []),
                                 values={"NODE_NAME": SAMPLE_NODE_NAME})
    return build_parser().parse_args(args)


def host_path_of(container: dict, path: str) -> str | None:
    """Where a path inside the container lives on the host (None: not on a hostPath volume)."""
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    best = None
    for mount in container.get("volumeMounts", []):
        mount_path = PurePosixPath(mount["mountPath"])
        target = PurePosixPath(path)
        if target == mount_path or mount_path in target.parents:
            if best is None or len(mount_path.parts) > len(PurePosixPath(best["mountPath"]).parts):
                best = mount
    if best is None or "hostPath" not in volumes[best["name"]]:
        return None
    relative = PurePosixPath(path).relative_to(best["mountPath"])
    return str(PurePosixPath(volumes[best["name"]]["hostPath"]["path"]) / relative)


def round_trip_through_api_models(obj: dict) -> dict:
    """The object as the official client's models see it: unknown fields are dropped."""
    from kubernetes.client import ApiClient
    client = ApiClient()
    version = obj["apiVersion"].split("/")[-1].capitalize()
    model = client._ApiClient__deserialize(obj, f"{version}{obj['kind']}")
    return client.sanitize_for_serialization(model)


# ------------------------------------------------------------------ manifest: objects
def test_manifest_holds_the_agent_objects_in_kube_system():
    kinds = sorted(doc["kind"] for doc in load_manifest())
    assert kinds == KINDS
    for doc in load_manifest():
        if doc["kind"] in ("ServiceAccount", "DaemonSet", "Role", "RoleBinding"):
            assert doc["metadata"]["namespace"] == "kube-system"


@pytest.mark.parametrize("kind", KINDS)
def test_every_field_is_known_to_the_api_models(kind):
    (obj,) = objects_of_kind(kind)
    assert round_trip_through_api_models(obj) == obj


def test_the_round_trip_reveals_a_misspelled_field():
    daemonset = the_daemonset()
    daemonset["spec"]["template"]["spec"]["hostnetwork"] = True
    assert round_trip_through_api_models(daemonset) != daemonset


@pytest.mark.parametrize("role_kind", ["ClusterRole", "Role"])
def test_the_binding_gives_the_role_to_the_daemonsets_service_account(role_kind):
    (binding,) = objects_of_kind(f"{role_kind}Binding")
    (role,) = objects_of_kind(role_kind)
    (account,) = objects_of_kind("ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]
    assert binding["metadata"].get("namespace") == role["metadata"].get("namespace")
    assert pod_spec()["serviceAccountName"] == account["metadata"]["name"]


def permissions_of(role: dict) -> set[tuple[str, str, str]]:
    return {(group, resource, verb)
            for rule in role["rules"]
            for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}


def granted_permissions() -> set[tuple[str, str, str]]:
    return set().union(*(permissions_of(role) for role in objects_of_kind("ClusterRole") + objects_of_kind("Role")))


def test_rbac_grants_exactly_what_the_code_calls():
    # derived from the shipped code's API call sites (tests/unit/project/api_calls.py), not a copy
    used, granted = permissions_used(), granted_permissions()
    assert not used - granted, f"called but not granted: {sorted(used - granted)}"
    assert not granted - used, f"granted but never called: {sorted(granted - used)}"


def test_what_the_code_reads_as_one_object_is_granted_on_that_object_alone():
    wide, one_object = permissions_by_scope()
    (cluster_role,) = objects_of_kind("ClusterRole")
    (role,) = objects_of_kind("Role")
    assert permissions_of(cluster_role) == wide
    assert permissions_of(role) == one_object == {("", CONFIG_MAPS.plural, "list"), ("", CONFIG_MAPS.plural, "watch")}
    namespace, name = DEFAULT_CONFIG.split("/")     # the ConfigMap --bgp-config names by default
    assert role["metadata"]["namespace"] == namespace
    assert all(rule["resourceNames"] == [name] for rule in role["rules"])
    assert not any(resource == CONFIG_MAPS.plural for _, resource, _ in permissions_of(cluster_role))


def test_the_topology_config_reflector_asks_for_its_one_object_in_its_namespace(monkeypatch):
    # RBAC honours the Role's resourceNames for a list or watch only when the request selects that
    # one name: what the agent's reflector sends is recorded at the HTTP seam
    from netagent.daemon.bgp_start import config_reflector
    from netagent.kube import reflector as reflector_module
    sent: list[tuple[str, str, list]] = []
    asked = threading.Event()

    def recording_open(api_client, method, path, *, query=None, **_):
        sent.append((method, path, list(query or [])))
        asked.set()
        raise OSError("recorded")     # the reflector backs off and retries
    monkeypatch.setattr(reflector_module, "open_request", recording_open)
    reflector = config_reflector(api_client=object(), config=DEFAULT_CONFIG, handler=lambda *a: None)
    reflector.start()
    try:
        assert asked.wait(10)
    finally:
        reflector.stop()
    namespace, name = DEFAULT_CONFIG.split("/")
    method, path, query = sent[0]
    assert (method, path) == ("GET", f"/api/v1/namespaces/{namespace}/configmaps")
    assert [(k, v) for k, v in query if k.endswith("Selector")] == [("fieldSelector", f"metadata.name={name}")]


def the_policy() -> tuple[dict, dict]:
    (policy,) = objects_of_kind("ValidatingAdmissionPolicy")
    (binding,) = objects_of_kind("ValidatingAdmissionPolicyBinding")
    return policy, binding


def test_the_own_node_policy_is_bound_denies_and_fails_closed():
    policy, binding = the_policy()
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]          # every namespace: Nodes have none
    assert policy["spec"]["failurePolicy"] == "Fail"


def test_the_own_node_policy_judges_every_node_write_of_the_agent_alone():
    policy, _ = the_policy()
    (account,) = objects_of_kind("ServiceAccount")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [NODES.group] and rule["apiVersions"] == [NODES.version]
    assert set(rule["resources"]) == {NODES.plural, f"{NODES.plural}/status"}
    assert {"UPDATE", "DELETE"} <= set(rule["operations"])   # a PATCH is an UPDATE in admission
    user = f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f'request.userInfo.username == "{user}"'
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["tokenNode"] == f"request.userInfo.extra[?'{NODE_NAME_EXTRA}'][0].orValue('')"
    validations = policy["spec"]["validations"]
    assert [v["expression"] for v in validations] == ['variables.tokenNode != ""',
                                                      "variables.tokenNode == variables.targetNode"]
    assert {v["reason"] for v in validations} == {"Forbidden"}      # 403, not the default 422 Invalid


def test_the_agent_cannot_patch_nodes_only_annotate_through_status():
    granted = granted_permissions()
    assert (NODES.group, f"{NODES.plural}/status", "patch") in granted
    assert not {verb for group, resource, verb in granted if resource == NODES.plural} - {"get", "list", "watch"}


@pytest.mark.parametrize("source, permissions", [
    ('Reflector(api_client=c, resource=PODS, handler=h)', {("", "pods", "list"), ("", "pods", "watch")}),
    ('request_json(c, "PATCH", NODES.object_path(n) + "/status", body=b)', {("", "nodes/status", "patch")}),
    ('request_json(c, "GET", NODES.object_path(n))', {("", "nodes", "get")}),
    ('request_json(c, "POST", f"/api/v1/namespaces/{ns}/events", body=b)', {("", "events", "create")}),
    ('open_request(c, "DELETE", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/{n}")',
     {("discovery.k8s.io", "endpointslices", "delete")}),
])
def test_the_call_reader_classifies_each_shape(source, permissions):
    assert permissions_in(source, where="example") == permissions


@pytest.mark.parametrize("keywords, one_object", [
    ('namespace=ns, field_selector=f"metadata.name={name}"', True),
    ('namespace=ns, field_selector="metadata.name=netagent-bgp"', True),
    ('field_selector=f"metadata.name={name}"', False),                        # every namespace
    ('namespace=ns', False),
    ('namespace=ns, field_selector=f"metadata.name={a},spec.x={b}"', False),
    ('namespace=ns, field_selector=f"spec.nodeName={name}"', False),
])
def test_the_call_reader_tells_one_object_reads_apart(keywords, one_object):
    sites = call_sites(f"Reflector(api_client=c, resource=CONFIG_MAPS, handler=h, {keywords})", where="example")
    assert {one for _, one in sites} == {one_object}


@pytest.mark.parametrize("source", ['request_json(c, method, path)', 'request_json(c, "GET", some_path)',
                                    'Reflector(api_client=c, resource=whatever, handler=h)'])
def test_the_call_reader_refuses_what_it_cannot_classify(source):
    with pytest.raises(UnclassifiedCall):
        permissions_in(source, where="example")


def test_rbac_grants_no_wildcards_or_secrets():
    for group, resource, verb in granted_permissions():
        assert "*" not in (group, resource, verb)
        assert resource != "secrets"


# ------------------------------------------------------------------ manifest: the pod
def test_the_pod_runs_first_and_everywhere():
    daemonset = the_daemonset()
    spec = pod_spec()
    assert spec["hostNetwork"] is True
    assert spec["priorityClassName"] == "system-node-critical"
    # A toleration with no key and operator Exists matches every taint of every effect.
    assert any(t.get("operator") == "Exists" and "key" not in t and "effect" not in t
               for t in spec["tolerations"])
    assert daemonset["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                                   "rollingUpdate": {"maxUnavailable": 1}}
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= \
        daemonset["spec"]["template"]["metadata"]["labels"].items()


def test_agent_arguments_parse_with_the_real_cli():
    args = parsed_agent_args()
    assert args.command == "run"
    assert args.cni_only is False
    assert args.node_name == SAMPLE_NODE_NAME
    assert args.cluster_cidr == ["10.244.0.0/16"]
    assert args.backend == "vxlan"


def subcommand_option_strings(*path: str) -> set[str]:
    parser = build_parser()
    for name in path:
        (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = subparsers.choices[name]
    return {option for action in parser._actions for option in action.option_strings}


@pytest.mark.parametrize("container_kind, subcommand", [("containers", ("run",)),
                                                        ("initContainers", ("cni", "install"))])
def test_flags_are_spelled_in_full(container_kind, subcommand):
    # argparse accepts a prefix of a flag: a rename that lengthens a flag would still parse.
    known = subcommand_option_strings(*subcommand)
    for container in pod_spec()[container_kind]:
        for arg in container["args"]:
            if arg.startswith("--"):
                assert arg.split("=", 1)[0] in known, f"{container['name']}: {arg}"


def test_node_name_comes_from_the_pods_node():
    env = {entry["name"]: entry for entry in agent_container()["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_an_undeclared_env_reference_is_refused():
    with pytest.raises(AssertionError, match="NODE_IP"):
        expand_env_references(["--iface-address=$(NODE_IP)"], [{"name": "NODE_NAME"}], values={})


AGENT_CAPABILITIES = {"NET_ADMIN", "NET_RAW", "SYS_ADMIN"}   # tests/deploy checks the running container has them


def test_the_agent_gets_capabilities_not_privileged_and_the_installer_none():
    context = agent_container()["securityContext"]
    assert "privileged" not in context and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"], "add": sorted(AGENT_CAPABILITIES)}
    (init,) = pod_spec()["initContainers"]
    assert init["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    # without privileged, only HostToContainer propagation is allowed (Bidirectional needs it)
    assert {m.get("mountPropagation", "None") for c in pod_spec()["containers"] + pod_spec()["initContainers"]
            for m in c["volumeMounts"]} <= {"None", "HostToContainer"}
    # ipvs and ebpf need privileged; not given (None) is iptables or nftables (daemon/dataplane.py)
    assert parsed_agent_args().proxy_mode in (None, "iptables", "nftables", "none")


def test_probes_point_at_the_status_bind_port():
    port = int(parsed_agent_args().status_bind.rsplit(":", 1)[1])
    container = agent_container()
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": port}, probe
    assert {"name": "status", "containerPort": port, "protocol": "TCP"} in container["ports"]


def test_metrics_are_served_on_loopback_only():
    import ipaddress

    from netagent.daemon.config import metrics_binds
    from netagent.infra.status_server import parse_bind
    binds = metrics_binds(parsed_agent_args().metrics_bind_address)
    assert binds and all(ipaddress.ip_address(parse_bind(bind)[0]).is_loopback for bind in binds), binds
    default = build_parser().parse_args(["run"]).metrics_bind_address
    assert metrics_binds(default) == ("127.0.0.1:10249",)   # the default too


def test_init_container_installs_only_the_binaries_into_the_hosts_cni_bin_dir():
    (init,) = pod_spec()["initContainers"]
    args = build_parser().parse_args(init["args"])
    assert (args.command, args.cni_command) == ("cni", "install")
    assert args.conf_dir is None  # the agent publishes the config once it has the pod CIDR
    assert host_path_of(init, args.bin_dir) == "/opt/cni/bin"
    assert init["image"] == agent_container()["image"]


def test_every_volume_mount_has_a_volume_and_every_volume_is_mounted():
    volumes = [v["name"] for v in pod_spec()["volumes"]]
    assert len(volumes) == len(set(volumes))
    mounted = set()
    for container in pod_spec()["containers"] + pod_spec()["initContainers"]:
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{container['name']}: {mount['name']} has no volume"
            mounted.add(mount["name"])
    assert mounted == set(volumes)


def test_paths_written_into_the_network_config_are_the_same_on_the_host():
    # The runtime's plugin runs on the host and reads agentSocket and ipam.dataDir from the
    # config the agent writes, so the agent's paths must be the host's paths.
    args = parsed_agent_args()
    container = agent_container()
    assert host_path_of(container, args.cni_socket) == args.cni_socket
    assert host_path_of(container, args.cni_data_dir) == args.cni_data_dir
    assert host_path_of(container, args.cni_conf_dir) == "/etc/cni/net.d"


@pytest.mark.parametrize("host_path, host_path_type, read_only", [
    ("/run/netagent", "DirectoryOrCreate", False),
    ("/var/lib/cni/networks", "DirectoryOrCreate", False),
    ("/etc/cni/net.d", "DirectoryOrCreate", False),
    ("/opt/cni/bin", "DirectoryOrCreate", True),  # delegated IPAM plugins run from CNI_PATH
    ("/run/xtables.lock", "FileOrCreate", False),
    ("/lib/modules", None, True),
])
def test_the_agent_sees_the_host_paths_it_needs(host_path, host_path_type, read_only):
    volumes = {v["hostPath"]["path"]: v for v in pod_spec()["volumes"] if "hostPath" in v}
    assert volumes[host_path]["hostPath"].get("type") == host_path_type
    (mount,) = [m for m in agent_container()["volumeMounts"] if m["name"] == volumes[host_path]["name"]]
    assert mount.get("readOnly", False) is read_only
    assert host_path_of(agent_container(), mount["mountPath"]) == host_path


def test_pod_network_namespaces_created_later_are_visible_to_the_agent():
    (mount,) = [m for m in agent_container()["volumeMounts"] if m["mountPath"] == "/run/netns"]
    assert mount["mountPropagation"] == "HostToContainer"
    assert host_path_of(agent_container(), "/run/netns/cni-1234") == "/run/netns/cni-1234"


# ------------------------------------------------------------------ Containerfile
def containerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: continuation lines joined, comments dropped."""
    lines = [line for line in CONTAINERFILE.read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    instructions = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            instructions.append((keyword.upper(), " ".join(rest.split())))
    return instructions


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def containerfile_stages() -> list[list[tuple[str, str]]]:
    """The instructions of each build stage (a FROM starts one; a leading ARG comes before any)."""
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in containerfile_instructions():
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, rest))
    return stages


def apt_installed(stage: list[tuple[str, str]]) -> set[str]:
    installed = set()
    for keyword, rest in stage:
        if keyword == "RUN":
            for command in rest.split("&&"):
                words = shlex.split(command)
                while words and "=" in words[0]:  # VAR=value before the command
                    words = words[1:]
                if words[:2] == ["apt-get", "install"]:
                    installed.update(w for w in words[2:] if not w.startswith("-"))
    return installed


def test_containerfile_base_is_an_argument_defaulting_to_debian_12_slim():
    instructions = containerfile_instructions()
    assert instructions[0][0] == "ARG"
    name, _, default = instructions[0][1].partition("=")
    assert re.fullmatch(r"(docker\.io/(library/)?)?debian:12-slim", default)
    froms = [rest.split()[0] for keyword, rest in instructions if keyword == "FROM"]
    assert froms == [f"${{{name}}}", f"${{{name}}}"]  # both stages: the venv's python is the base's


def test_containerfile_final_stage_has_the_kernel_tools_and_no_build_tools():
    build, final = containerfile_stages()
    assert {"python3", "python3-venv", "musl-tools"} <= apt_installed(build)
    assert apt_installed(final) == {"python3", "iproute2", "iptables", "ipset", "conntrack", "nftables",
                                    "python3-nftables", "bird2",   # the nftables dataplane, BGP
                                    "${EBPF_PACKAGES}"}   # bcc in the eBPF image (build-image --ebpf) only
    assert ("ARG", "EBPF_PACKAGES=") in final
    assert ("COPY", "--from=build /opt/netagent /opt/netagent") in final
    runs = " ".join(rest for keyword, rest in final if keyword == "RUN")
    assert "rm -rf /var/lib/apt/lists/*" in runs and "apt-get clean" in runs


def test_init_container_installs_the_shim_the_image_builds():
    build, _ = containerfile_stages()
    (shim_build,) = [rest for keyword, rest in build if keyword == "RUN" and "cni/shim/build.sh" in rest]
    built_at = shim_build.split()[-1]
    (init,) = pod_spec()["initContainers"]
    args = build_parser().parse_args(init["args"])
    assert args.shim == built_at
    assert host_path_of(init, args.bin_dir) == "/opt/cni/bin"


def test_containerfile_copies_every_package_and_installs_them_into_a_venv():
    instructions = containerfile_instructions()
    copied = {}
    for keyword, rest in instructions:
        if keyword == "COPY":
            *sources, destination = rest.split()
            for source in sources:
                copied[source] = destination
    declared = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    for pattern in declared:
        package = pattern.rstrip("*")
        assert (REPO / package).is_dir(), package
        if package == "lab":  # a client of the agent (`netagent lab`), never in the image
            assert package not in copied, "the image ships the product only, not the lab"
            assert package in (REPO / ".containerignore").read_text().split(), "lab/ is not in .containerignore"
            continue
        assert copied.get(package, "").rstrip("/") == f"/src/{package}", f"{package} is not copied to /src"
    assert copied["pyproject.toml"] == "/src/"
    runs = " && ".join(rest for keyword, rest in instructions if keyword == "RUN")
    venv = re.search(r"python3 -m venv --system-site-packages (\S+)", runs)
    assert venv, "no venv made with --system-site-packages"
    assert re.search(rf"{re.escape(venv.group(1))}/bin/pip install [^&]*/src\b", runs)


def containerfile_venv() -> str:
    runs = " ".join(rest for keyword, rest in containerfile_instructions() if keyword == "RUN")
    return re.search(r"python3 -m venv --system-site-packages (\S+)", runs).group(1)


def test_containerfile_entrypoint_is_the_netagent_console_script():
    (entrypoint,) = [rest for keyword, rest in containerfile_instructions() if keyword == "ENTRYPOINT"]
    assert yaml.safe_load(entrypoint) == [f"{containerfile_venv()}/bin/netagent"]  # exec form
    assert pyproject()["project"]["scripts"]["netagent"] == "netagent.cli:main"
    for container in pod_spec()["containers"] + pod_spec()["initContainers"]:
        assert "command" not in container, f"{container['name']} overrides the entrypoint"


def test_image_tag_is_the_project_version():
    images = {c["image"] for c in pod_spec()["containers"] + pod_spec()["initContainers"]}
    (image,) = images
    assert image.rsplit(":", 1)[1] == pyproject()["project"]["version"]
