"""A Service's IP families: `ipFamilyPolicy`, `ipFamilies` and `clusterIPs`, as the real registry fills them.

The API server is configured with one Service range per family (`--service-cidr`, the first
the cluster's primary family, as kube-apiserver's `--service-cluster-ip-range`). For each
Service (not ExternalName, whose family fields are cleared) this module decides, the way
Kubernetes' registry does (read as documentation):

- the policy: given, else (an update) the stored one unless the client named two families of
  a `SingleStack` Service, else `RequireDualStack` when the client named two families or two
  cluster IPs, else `SingleStack` (headless Services without a selector: `RequireDualStack`,
  since they have no address to allocate and should see every family);
- the families: those of the given `clusterIPs` first, then the given `ipFamilies`, then the
  cluster's primary; a dual-stack policy adds the cluster's other family
  (`PreferDualStack` only when the cluster has one; `RequireDualStack` on a single-stack
  cluster is refused with a 422, except for a selectorless headless Service);
- validation, every problem together: known policy values, at most two distinct families each
  configured on this cluster, at most two cluster IPs of different families, each matching its
  `ipFamilies` entry and inside that family's range, `clusterIPs[0] == clusterIP`,
  `SingleStack` with one of each;
- updates: the primary family and cluster IP never change; raising the policy to dual stack
  allocates the secondary, lowering it to `SingleStack` keeps only the first of each (what
  Kubernetes documents for up- and downgrades).

The addresses themselves come from `ServiceAddresses` (`service_spec.py`), which calls
`plan_families` and then allocates one address per family missing one.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from netagent.kernel.families import IpFamily

SINGLE_STACK = "SingleStack"
PREFER_DUAL_STACK = "PreferDualStack"
REQUIRE_DUAL_STACK = "RequireDualStack"
POLICIES = (SINGLE_STACK, PREFER_DUAL_STACK, REQUIRE_DUAL_STACK)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class InvalidFamilies(ValueError):
    """The family fields break Kubernetes' rules; `errors` are field messages (`spec.x: ...`)."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("; ".join(errors))


def parse_service_cidrs(text: str) -> dict[IpFamily, Network]:
    """`10.96.0.0/16,fd00:10:96::/112` -> {V4: ..., V6: ...} in the order given (primary first);
    ValueError for a bad or repeated family, or more than two."""
    ranges: dict[IpFamily, Network] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        network = ipaddress.ip_network(item)
        family = IpFamily.of(network)
        if family in ranges:
            raise ValueError(f"service CIDRs {text!r}: two ranges of {family.label}")
        ranges[family] = network
    if not ranges:
        raise ValueError("no service CIDR given")
    return ranges


@dataclass(frozen=True)
class FamilyPlan:
    """What a Service's family fields become: its policy, its families (primary first) and the
    cluster IPs it keeps or asked for, by family ("None" for headless)."""

    policy: str
    families: tuple[IpFamily, ...]
    wanted: dict  # IpFamily -> address text it asked for (or kept); absent: allocate one


def _family_of(text: object) -> IpFamily | None:
    try:
        return IpFamily(ipaddress.ip_address(text).version)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _given_families(spec: dict, errors: list[str]) -> list[IpFamily]:
    given = spec.get("ipFamilies")
    if given is None:
        return []
    if not isinstance(given, list):
        errors.append("spec.ipFamilies: Invalid value: must be a list")
        return []
    families: list[IpFamily] = []
    for index, label in enumerate(given):
        try:
            family = IpFamily.from_label(label) if isinstance(label, str) else None
        except ValueError:
            family = None
        if family is None:
            errors.append(f"spec.ipFamilies[{index}]: Unsupported value: {label!r}: supported values: "
                          "\"IPv4\", \"IPv6\"")
        elif family in families:
            errors.append(f"spec.ipFamilies[{index}]: Duplicate value: {label!r}")
        else:
            families.append(family)
    if len(given) > 2:
        errors.append("spec.ipFamilies: Too many: may contain at most 2 items (one per family)")
    return families


def _given_cluster_ips(spec: dict, errors: list[str]) -> list[str]:
    ips = spec.get("clusterIPs")
    if ips is None:
        ips = [spec["clusterIP"]] if spec.get("clusterIP") else []
    if not isinstance(ips, list) or not all(isinstance(ip, str) for ip in ips):
        errors.append("spec.clusterIPs: Invalid value: must be a list of addresses")
        return []
    cluster_ip = spec.get("clusterIP")
    if ips and cluster_ip and ips[0] != cluster_ip:
        errors.append("spec.clusterIPs[0]: Invalid value: must match spec.clusterIP")
    if len(ips) > 2:
        errors.append("spec.clusterIPs: Too many: may contain at most 2 items (one per family)")
    if "None" in ips and ips != ["None"]:
        errors.append("spec.clusterIPs: Invalid value: \"None\" must be the only entry of a headless Service")
    return [ip for ip in ips if ip]


def plan_families(spec: dict, *, ranges: dict[IpFamily, Network], old_spec: dict | None) -> FamilyPlan:
    """The policy, families and wanted addresses of a defaulted, non-ExternalName `spec`; raise
    `InvalidFamilies` with every field message (the caller turns them into a 422)."""
    errors: list[str] = []
    cluster_families = list(ranges)
    dual_cluster = len(cluster_families) == 2
    old_spec = old_spec or {}
    old_ips = [ip for ip in old_spec.get("clusterIPs") or [old_spec.get("clusterIP")] if ip]
    ips = _given_cluster_ips(spec, errors)
    families = _given_families(spec, errors)
    headless = ips == ["None"] or (old_ips == ["None"] and not ips)
    selectorless_headless = headless and not spec.get("selector")
    policy = spec.get("ipFamilyPolicy")
    if policy is None:   # an update keeps its policy unless it names two families of a single-stack one
        given_two = len(ips) == 2 or len(families) == 2
        old_policy = old_spec.get("ipFamilyPolicy")
        if old_policy and not (given_two and old_policy == SINGLE_STACK):
            policy = old_policy
        elif given_two or selectorless_headless:
            policy = REQUIRE_DUAL_STACK
        else:
            policy = SINGLE_STACK
    if policy not in POLICIES:
        errors.append(f"spec.ipFamilyPolicy: Unsupported value: {policy!r}: supported values: "
                      + ", ".join(f'"{p}"' for p in POLICIES))
        raise InvalidFamilies(errors)
    if policy == REQUIRE_DUAL_STACK and not dual_cluster and not selectorless_headless:
        errors.append("spec.ipFamilyPolicy: Invalid value: \"RequireDualStack\": this cluster is not "
                      "configured for dual-stack services")
    if old_ips and old_ips != ["None"]:   # the primary address and family never change
        if ips and ips[0] != old_ips[0]:
            errors.append(f"spec.clusterIP: Invalid value: {ips[0]!r}: field is immutable")
        if len(ips) == 2 and len(old_ips) == 2 and ips[1] != old_ips[1] and policy != SINGLE_STACK:
            errors.append(f"spec.clusterIPs[1]: Invalid value: {ips[1]!r}: may not change once set")
        old_families = [f for f in map(_family_of, old_ips) if f is not None]
        if policy == SINGLE_STACK:   # a downgrade keeps the first of each
            ips = old_ips[:1]
            families = families[:1]
        elif len(ips) < 2:
            ips = old_ips
        if families and old_families and families[0] != old_families[0]:
            errors.append(f"spec.ipFamilies[0]: Invalid value: {families[0].label!r}: may not change once set")
    ip_families: list[IpFamily] = []
    for index, ip in enumerate(ip for ip in ips if ip != "None"):
        family = _family_of(ip)
        if family is None:
            errors.append(f"spec.clusterIPs[{index}]: Invalid value: {ip!r}: must be a valid IP address")
            continue
        if family in ip_families:
            errors.append(f"spec.clusterIPs[{index}]: Invalid value: {ip!r}: may not be of the same family as "
                          "clusterIPs[0] (one address per family)")
            continue
        if index < len(families) and families[index] != family:
            errors.append(f"spec.clusterIPs[{index}]: Invalid value: {ip!r}: must be of family "
                          f"{families[index].label} (spec.ipFamilies[{index}])")
        ip_families.append(family)
        network = ranges.get(family)
        if network is not None and ipaddress.ip_address(ip) not in network:
            path = "spec.clusterIP" if index == 0 else f"spec.clusterIPs[{index}]"
            errors.append(f"{path}: Invalid value: {ip!r}: provided IP is not in the valid "
                          f"range. The range of valid IPs is {network}")
    chosen = ip_families + [f for f in families if f not in ip_families]
    if policy == SINGLE_STACK and len(chosen) > 1:
        errors.append("spec.ipFamilyPolicy: Invalid value: \"SingleStack\": must be RequireDualStack or "
                      "PreferDualStack when multiple IP families are specified")
    if not chosen:
        chosen = [cluster_families[0]]
    if policy == SINGLE_STACK:
        chosen = chosen[:1]
    elif dual_cluster or selectorless_headless:
        chosen += [f for f in cluster_families if f not in chosen]
    for index, family in enumerate(chosen):
        if family not in ranges:
            errors.append(f"spec.ipFamilies[{index}]: Invalid value: {family.label!r}: not configured on "
                          "this cluster")
    if errors:
        raise InvalidFamilies(errors)
    chosen = chosen[:2]
    if headless:
        return FamilyPlan(policy=policy, families=tuple(chosen), wanted={family: "None" for family in chosen})
    wanted = {_family_of(ip): ip for ip in ips if ip != "None"}
    return FamilyPlan(policy=policy, families=tuple(chosen),
                      wanted={family: wanted[family] for family in chosen if family in wanted})
