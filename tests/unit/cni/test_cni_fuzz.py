"""Property-based fuzzing of the CNI plugin (Hypothesis), on every path a request can take.

Each case is a sequence of requests (ADD, DEL, CHECK, GC, STATUS, VERSION and garbage
commands) against one fresh node (`cni_fuzz_world.World`): mostly well-formed, mutated at
random in the config (any key replaced by any JSON value, hostile strings, malformed or
chained `prevResult`s, bad IPAM ranges, FIFOs and devices as files), in the environment
(hostile IDs and interface names, missing, relative or bogus netns paths, non-UTF-8
bytes) and in the raw bytes (truncated, deeply nested). The same cases run in-process
(`cni.dispatch.execute`), through the agent's socket with the Python client, and through
the agent's socket with the static C shim. After every request the invariants of
`cni_fuzz_world` hold: a spec answer whose exit status and code agree; nothing new after
a failed ADD; nothing of an attachment after its successful DEL; every pod address
reserved by its own attachment and held by no other.

Budget: 510 cases in CI (about 15 s). `NETAGENT_FUZZ_EXAMPLES=N` runs N cases on
each path; `NETAGENT_FUZZ_SEED=S` replays a run (the seed is printed at the start, and the
figures per path at the end, with `-s`).
"""
from __future__ import annotations

import json
import os
import random

import pytest
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

from tests.shim_support import build_shim_or_skip
from tests.unit.cni.cni_fuzz_world import (
    PODS,
    Figures,
    Path,
    World,
    check_answer,
    check_deleted,
    check_failed_add,
    check_world,
)

SEED = int(os.environ.get("NETAGENT_FUZZ_SEED") or random.SystemRandom().randrange(1 << 32))
LONG = int(os.environ.get("NETAGENT_FUZZ_EXAMPLES") or 0)
CI_CASES = {Path.IN_PROCESS: 300, Path.CLIENT: 150, Path.SHIM: 60}
FIGURES = {path: Figures() for path in Path}
NETWORK = "fuzznet"


def budget(path: Path):
    return settings(max_examples=LONG or CI_CASES[path], deadline=None, database=None, derandomize=False,
                    suppress_health_check=list(HealthCheck), print_blob=True)


@pytest.fixture(scope="module", autouse=True)
def _seed_and_figures():
    print(f"\nCNI fuzz seed {SEED} (replay: NETAGENT_FUZZ_SEED={SEED}); cases per path: "
          + ", ".join(f"{p.value} {LONG or n}" for p, n in CI_CASES.items()))
    yield
    for path, figures in FIGURES.items():
        if figures.cases:
            print("\nCNI fuzz figures, " + figures.line(path))


# ---------------------------------------------------------------- strategies

HOSTILE_TEXT = ["", "abc\n", "c0\n", "../../etc", "a" * 1025, "a b", "\u00e7", "c0 ", "all", "default", ".", "..",
                "x" * 16, "eth0\n", "eth0;reboot", "$(touch /tmp/pwned)", "10.77.0.0/\u0662\u0664", "\t", "\\"]
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 70000), st.floats(allow_nan=False, width=32),
                      st.text(max_size=12), st.sampled_from(HOSTILE_TEXT))
json_values = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
addresses = st.sampled_from(["10.77.0.9/24", "fd00:77::9/64", "bogus", "10.77.0.9", "10.77.0.9/33", "", 5,
                             "192.0.2.5/32", "::/0", "10.77.0.\u0662/24"])
prev_results = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={
        "cniVersion": st.sampled_from(["1.0.0", "0.4.0", 7]),
        "interfaces": st.one_of(json_values, st.lists(st.fixed_dictionaries({}, optional={
            "name": st.sampled_from(["eth0", "lo0", 3]), "sandbox": st.sampled_from(list(PODS) + [True]),
            "mac": st.sampled_from(["02:00:00:00:00:01", 1]), "mtu": st.sampled_from([1500, "x"])}), max_size=3)),
        "ips": st.one_of(json_values, st.lists(st.fixed_dictionaries({}, optional={
            "address": addresses, "gateway": addresses, "interface": st.sampled_from([0, 1, 2, 9, -1, True, "0"]),
            "version": st.sampled_from(["4", "6", 4])}), max_size=3)),
        "routes": st.one_of(json_values, st.lists(st.fixed_dictionaries({}, optional={
            "dst": addresses, "gw": addresses, "mtu": st.sampled_from([1400, "x"])}), max_size=2)),
        "dns": st.one_of(json_values, st.fixed_dictionaries({}, optional={
            "nameservers": st.one_of(json_values, st.lists(addresses, max_size=2)),
            "domain": json_values, "search": json_values}))}))


def safe_files(world: World) -> dict:
    """Paths under the world's own directory that mutations may name (never the host's)."""
    fifo = os.path.join(world.dir, "fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
        with open(os.path.join(world.dir, "resolv.conf"), "w") as f:
            f.write("nameserver 10.96.0.10\nsearch svc.cluster.local\n")
    return {"fifo": fifo, "resolv": os.path.join(world.dir, "resolv.conf"), "dir": world.dir,
            "ipam2": world.data_dirs[1]}


def mutation_values(world: World, key: str):
    files = safe_files(world)
    if key == "ipam.dataDir":
        # never "" or None: those mean /var/lib/cni/networks, the host's own
        return st.sampled_from(["relative/dir", files["ipam2"], 7, files["resolv"]])
    if key == "ipam.resolvConf":
        return st.sampled_from([files["fifo"], files["resolv"], files["dir"], "/dev/zero", "/dev/null", "rel", 3])
    if key == "prevResult":
        return prev_results
    if key in ("ipam.ranges", "ipam.subnet"):
        subnet = st.sampled_from(["10.77.0.0/24", "0.0.0.0/0", "::/0", "10.77.0.0/31", "10.77.0.1/24",
                                  "fd00:77::/64", "10.77.0.0/\u0662\u0664", "10.78.0.0/30", "bogus", 5])
        one = st.fixed_dictionaries({"subnet": subnet}, optional={
            "gateway": st.sampled_from(["10.77.0.255", "10.77.0.0", "10.77.0.1", "1.2.3.4", "x"]),
            "rangeStart": st.sampled_from(["10.77.0.200", "10.77.0.0", "fd00:77::5"]),
            "rangeEnd": st.sampled_from(["10.77.0.10", "10.77.0.254", "10.77.0.255"])})
        return subnet if key == "ipam.subnet" else st.one_of(json_values, st.lists(st.lists(one, max_size=3),
                                                                                   max_size=3))
    if key in ("name", "bridge"):
        return st.one_of(st.sampled_from(HOSTILE_TEXT + ["n" * 245, "n" * 246, "other"]), json_leaf)
    if key == "agentSocket" and world.path is Path.SHIM:
        return st.just(world.socket_path)  # the shim must reach this world's agent
    if key == "agentSocket":
        return st.sampled_from(["relative.sock", "/" + "s" * 120, world.socket_path, 5])
    return json_values


MUTABLE_KEYS = ["cniVersion", "name", "type", "mode", "bridge", "mtu", "hairpinMode", "dns", "prevResult",
                "agentSocket", "runtimeConfig", "args", "ipam", "ipam.type", "ipam.dataDir", "ipam.resolvConf",
                "ipam.ranges", "ipam.subnet", "ipam.routes", "ipam.dns", "ipam.ips", "cni.dev/valid-attachments"]


@st.composite
def configs(draw, world: World, last_result: dict | None) -> bytes:
    conf: dict = {"cniVersion": draw(st.sampled_from(["1.1.0", "1.0.0", "0.4.0", "0.3.1"])), "name": NETWORK,
                  "type": "netagent", "mode": draw(st.sampled_from(["bridge", "routed"])),
                  "agentSocket": world.socket_path,
                  "ipam": {"type": "netagent", "dataDir": world.data_dirs[0],
                           "ranges": [[{"subnet": "10.77.0.0/28"}]]}}
    if draw(st.booleans()):
        conf["ipam"]["ranges"].append([{"subnet": "fd00:77::/64"}])
    if last_result is not None and draw(st.booleans()):
        conf["prevResult"] = last_result  # a real chain: CHECK has something to compare
    mutated = draw(st.lists(st.sampled_from(MUTABLE_KEYS), max_size=2, unique=True)) if draw(st.booleans()) else []
    for key in mutated:
        value = draw(mutation_values(world, key))
        if key.startswith("ipam.") and isinstance(conf.get("ipam"), dict):
            conf["ipam"][key[5:]] = value
        else:
            conf[key] = value
    ipam = conf.get("ipam")
    if isinstance(ipam, dict) and ipam.get("dataDir") == world.data_dirs[1] and isinstance(conf.get("name"), str):
        # one network, one IPAM database: a network kept in two data directories at once is two
        # address spaces by configuration (host-local's too), not something a plugin can police
        conf["name"] += "-2"
    text = json.dumps(conf).encode()
    form = draw(st.sampled_from(["json"] * 20 + ["truncated", "deep", "bytes"]))
    if form == "truncated":
        return text[:draw(st.integers(0, len(text)))]
    if form == "deep":
        depth = draw(st.integers(400, 3000))
        return text[:-1] + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"
    if form == "bytes":
        return draw(st.binary(max_size=200))
    return text


ENV_KEYS = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS", "CNI_ARGS", "CNI_PATH")


def hostile_env_values(world: World, key: str):
    if key == "CNI_COMMAND":
        return st.sampled_from(["", "add", "ADD\n", "FROB", "VERSION"])
    if key in ("CNI_CONTAINERID", "CNI_IFNAME"):
        return st.sampled_from(HOSTILE_TEXT)
    if key == "CNI_NETNS":
        return st.sampled_from(["/var/run/netns/missing", "relative", "", "/"])
    if key == "CNI_ARGS":
        return st.sampled_from(["IP=10.77.0.5", "IP=bogus", "Surprise=1", "noequals", "IP=10.77.0.5,fd00:77::5",
                                "K8S_POD_NAME=a;K8S_POD_NAMESPACE=b"])
    return st.sampled_from(["", "relative"])


@st.composite
def environments(draw, world: World) -> dict:
    """A runtime's environment, mostly well-formed; now and then one or two variables hostile,
    missing, or holding bytes that are not UTF-8."""
    env: dict = {
        "CNI_COMMAND": draw(st.sampled_from(["ADD"] * 5 + ["DEL"] * 3 + ["CHECK", "GC", "STATUS", "VERSION"])),
        "CNI_CONTAINERID": draw(st.sampled_from(["c0", "c1", "c2"])),
        "CNI_IFNAME": draw(st.sampled_from(["eth0"] * 3 + ["eth1"])),
        "CNI_NETNS": draw(st.sampled_from(PODS)), "CNI_ARGS": draw(st.sampled_from(["", "IgnoreUnknown=1"])),
        "CNI_PATH": world.cni_path}
    hostile = draw(st.lists(st.sampled_from(ENV_KEYS), max_size=2, unique=True)) if draw(st.integers(0, 2)) == 0 else []
    for key in hostile:
        how = draw(st.sampled_from(["hostile", "hostile", "missing", "bytes"]))
        if how == "missing":
            del env[key]
        elif how == "bytes":
            env[key] = env[key].encode() + b"\xff\xfe"
        else:
            env[key] = draw(hostile_env_values(world, key))
    return env


# ---------------------------------------------------------------- the property

def run_case(world: World, data, figures: Figures) -> None:
    figures.cases += 1
    last_result = None
    for _ in range(data.draw(st.integers(1, 6), label="requests")):
        env = data.draw(environments(world), label="env")
        stdin = data.draw(configs(world, last_result), label="config")
        command = env.get("CNI_COMMAND")
        before = world.snapshot() if command == "ADD" else None
        answer = world.request(env, stdin)
        figures.requests += 1
        parsed = check_answer(figures, command, answer)
        if command == "ADD" and answer[0] != 0:
            check_failed_add(world, figures, before)
        if command == "ADD" and answer[0] == 0:
            last_result = parsed
        if command == "DEL" and answer[0] == 0:
            conf = json.loads(stdin)  # it succeeded, so it parsed
            check_deleted(world, figures, network=conf["name"], container_id=env["CNI_CONTAINERID"],
                          ifname=env["CNI_IFNAME"])
        check_world(world, figures)


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> str:
    return build_shim_or_skip(tmp_path_factory.mktemp("fuzz-shim"))


def _fuzz(path: Path, shim: str | None = None):
    @seed(SEED)
    @budget(path)
    @given(data=st.data())
    def case(data) -> None:
        note(f"NETAGENT_FUZZ_SEED={SEED}")
        world = World(path, shim=shim)
        try:
            run_case(world, data, FIGURES[path])
        finally:
            world.close()
    case()


def test_fuzz_in_process():
    _fuzz(Path.IN_PROCESS)


def test_fuzz_through_the_agent_with_the_python_client():
    _fuzz(Path.CLIENT)


def test_fuzz_through_the_agent_with_the_shim(shim):
    _fuzz(Path.SHIM, shim)
