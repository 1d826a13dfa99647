"""The iptables dataplane's chains read back (`iptables-save -c -t filter` text) into
policy/readback.py's `KernelPolicy`: each pod chain's header comment (render.py) names the
direction, pod, address and policies; the pod directory chains name every programmed local
pod; a `ReadRule`'s comment is the rule's purpose (the comment without `netagent policy: `)."""
from __future__ import annotations

from collections.abc import Sequence

from netagent.kernel import owned
from netagent.kernel.iptables.restore_format import split_tokens
from netagent.policy.buckets import DIRECTORY_PREFIX, HEADER, POD_ENTRY
from netagent.policy.readback import KernelPolicy, ReadRule, pod_directions

_POD_ENTRY = POD_ENTRY.removeprefix(HEADER)      # a directory rule's purpose: + "ns/name ip"


def _comment(spec: Sequence[str]) -> str:
    for index, token in enumerate(spec[:-1]):
        if token == "--comment":
            return spec[index + 1]
    return ""


def _target(spec: Sequence[str]) -> str:
    return spec[spec.index("-j") + 1] if "-j" in spec[:-1] else ""


def _match_only(spec: Sequence[str]) -> tuple[str, ...]:
    """The spec without its comment match and target."""
    out, index = [], 0
    while index < len(spec):
        if spec[index:index + 3] == ("-m", "comment", "--comment"):
            index += 4
        elif spec[index] == "-j":
            index += 2
        else:
            out.append(spec[index])
            index += 1
    return tuple(out)


def parse_kernel_policy(save_text: str) -> KernelPolicy:
    """Our chains in `iptables-save -c -t filter` output (counters optional)."""
    chains: dict[str, list[ReadRule]] = {}
    for raw in save_text.splitlines():
        line, packets = raw.strip(), 0
        if line.startswith("["):
            counters, _, line = line[1:].partition("]")
            packets = int(counters.split(":")[0] or 0)
            line = line.strip()
        if not line.startswith(f"-A {owned.POLICY_PREFIX}"):
            continue
        _, chain, *tokens = split_tokens(line)
        spec = tuple(tokens)
        chains.setdefault(chain, []).append(ReadRule(_match_only(spec), _comment(spec).removeprefix(HEADER), _target(spec), packets))
    found = KernelPolicy(guard=[rule for rule in chains.get(owned.POLICY_CHAIN, []) if rule.target == "DROP"])
    for chain, rules in chains.items():
        if chain.startswith(DIRECTORY_PREFIX):
            entries = (rule.comment.removeprefix(_POD_ENTRY).split() for rule in rules if rule.comment.startswith(_POD_ENTRY))
            found.local.update((entry[0], entry[1]) for entry in entries if len(entry) == 2)
    found.pods.extend(pod_directions(chains, address_first=False))
    return found
