"""Discovery and `/version`: what kubectl and the official client ask before any request.

`/api`, `/apis`, `/apis/GROUP` and `/api/v1`, `/apis/GROUP/VERSION` list the groups,
versions and resources this server serves (the `kinds.py` table: short names, categories
and `/status` subresources included, so `kubectl get svc`, `get all` and `api-resources`
work), with the verbs the real server lists for them; `/api` advertises the address the
client reached. `VERSION_INFO` is the answer to `/version`: a current release, so kubectl
does not warn about version skew. Only GET reaches here, for a path that names no resource.
"""
from __future__ import annotations

import collections

from lab.apiserver.kinds import SERVED, Kind

VERSION_INFO = {
    "major": "1",
    "minor": "37",
    "emulationMajor": "1",
    "emulationMinor": "37",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "36",
    "gitVersion": "v1.37.0-netagent-lab",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "none (netagent lab API server, Python)",
    "compiler": "none",
    "platform": "linux/amd64",
}
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def _resource_entry(kind: Kind) -> dict:
    resource = kind.resource
    entry: dict = {"name": resource.plural, "singularName": resource.kind.lower(), "namespaced": resource.namespaced,
                   "kind": resource.kind, "verbs": VERBS}
    if kind.short_names:
        entry["shortNames"] = list(kind.short_names)
    if kind.categories:
        entry["categories"] = list(kind.categories)
    return entry


def discovery(path: str, *, server_address: str) -> dict | None:
    """The discovery document served at `path`, or None when `path` is not a discovery path."""
    groups: dict[str, list[Kind]] = collections.defaultdict(list)
    for kind in SERVED:
        groups[kind.resource.api_version].append(kind)
    if path == "/api":
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        }
    named = sorted({k.resource.group for k in SERVED if k.resource.group})

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
    entries = []
    for kind in groups[group_version]:
        entries.append(_resource_entry(kind))
        if kind.status:
            entries.append(
                {"name": f"{kind.resource.plural}/status", "singularName": "", "namespaced": kind.resource.namespaced,
                 "kind": kind.resource.kind, "verbs": ["get", "patch", "update"]}
            )
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": entries}
