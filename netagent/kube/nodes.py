"""The Node request the agent makes itself, outside the Node reflector: its annotations.

The agent reads its own Node (podCIDR, addresses) from the one Node reflector's cache once it
has synced (noderoutes/agent.py waits there for its lease); nothing GETs it. `get_node` is a
plain read for tools and tests. The agent publishes its backend data (VTEP MAC, public IP) as
annotations with one merge patch:
a merge patch touches only the keys it names, so two writers of different annotations never
conflict, and a None value removes a key. Plain dicts, like everything in `netagent.kube`.

The patch goes to the `nodes/status` subresource, as flannel's does: the API server applies a
status write's metadata (labels, annotations) and keeps the spec, so the agent needs only
`patch` on `nodes/status` and never the right to change any Node's spec (podCIDR, taints,
unschedulable) that `patch` on `nodes` would give it (deploy/netagent.yaml's ClusterRole).
"""
from __future__ import annotations

from collections.abc import Mapping

from netagent.kube.config import PatchType, request_json
from netagent.kube.resources import NODES


def get_node(api_client, name: str) -> dict:
    """The Node object; KubeApiError (status 404) when there is none."""
    return request_json(api_client, "GET", NODES.object_path(name))


def patch_node_annotations(api_client, node_name: str, annotations: Mapping[str, str | None]) -> dict:
    """Set (str) or remove (None) annotations on a Node through its status subresource; returns
    the updated Node."""
    body = {"metadata": {"annotations": dict(annotations)}}
    return request_json(api_client, "PATCH", NODES.object_path(node_name) + "/status", body=body,
                        content_type=PatchType.MERGE.value)
