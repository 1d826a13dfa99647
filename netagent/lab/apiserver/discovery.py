"""Discovery and `/version`: what the official client asks before it makes any request.

`/api`, `/apis`, `/apis/GROUP` and `/api/v1`, `/apis/GROUP/VERSION` list the groups,
versions and resources this server serves (from `kube.resources`, with their `/status`
subresources), with the verbs the real server lists for them; `VERSION_INFO` is the answer
to `/version`. Only GET reaches here, for a path that names no resource. Derived from
`ALL_RESOURCES` on each request so that a resource added there is discoverable at once.
"""
from __future__ import annotations

import collections

from netagent.kube.resources import ALL_RESOURCES, Resource
from netagent.lab.apiserver.objects import STATUS_SUBRESOURCE

VERSION_INFO = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-netagent-lab",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "none (netagent lab API server, Python)",
    "compiler": "none",
    "platform": "linux/amd64",
}


def discovery(path: str, *, server_address: str) -> dict | None:
    """The discovery document served at `path`, or None when `path` is not a discovery path."""
    groups: dict[str, list[Resource]] = collections.defaultdict(list)
    for resource in ALL_RESOURCES:
        groups[resource.api_version].append(resource)
    if path == "/api":
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        }
    named = sorted({r.group for r in ALL_RESOURCES if r.group})

    def group_entry(group: str) -> dict:
        version = {"groupVersion": f"{group}/v1", "version": "v1"}
        return {"name": group, "versions": [version], "preferredVersion": version}

    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_entry(g) for g in named]}
    if path.startswith("/apis/") and path.count("/") == 2 and path[6:] in named:
        return {"kind": "APIGroup", "apiVersion": "v1", **group_entry(path[6:])}
    group_version = path[5:] if path.startswith("/api/") else path[6:] if path.startswith("/apis/") else None
    if group_version not in groups:
        return None
    verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
    entries = []
    for resource in groups[group_version]:
        entries.append(
            {"name": resource.plural, "singularName": resource.kind.lower(), "namespaced": resource.namespaced,
             "kind": resource.kind, "verbs": verbs}
        )
        if resource in STATUS_SUBRESOURCE:
            entries.append(
                {"name": f"{resource.plural}/status", "singularName": "", "namespaced": resource.namespaced,
                 "kind": resource.kind, "verbs": ["get", "patch", "update"]}
            )
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": entries}
