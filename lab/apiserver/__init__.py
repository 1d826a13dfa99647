"""The Kubernetes API test server: the real wire protocol, in memory.

There is no real API server on the build machine, so the lab and the tests run this one and
the agent's unchanged client code (the official `kubernetes` client) and the real kubectl
(v1.37) talk to it. What it reproduces is what a watch-based agent and an operator at a
terminal can observe of a real server:

- The kinds of `kinds.py` (one table: Namespaces, Nodes, Pods, Services, Endpoints, Events,
  discovery.k8s.io EndpointSlices, and whatever `kube.resources` adds): paths, verbs and
  Status errors (collections cluster-wide and per namespace, objects, `/status` where the
  real one has it), `/version` (v1.37), `/healthz`, `/readyz`, discovery with short names
  and categories (`get svc`, `get all`), and `/api` advertising the address the client reached.
- One global resourceVersion counter, like etcd's revision. Writes that change nothing do
  not bump it and make no event, like the real server.
- list with `limit`/`continue` served from a consistent snapshot (an unknown or compacted
  token is 410 Expired), `resourceVersion`/`resourceVersionMatch` (Exact lists are rebuilt
  from the history; a revision not reached yet is 504 ResourceVersionTooLarge), label
  selectors (=, ==, !=, in, notin, exists, !key, >, <) and the field labels the real server
  has per kind (pods' status.podIP, spec.nodeName, ...; events' involvedObject.*).
- watch (`?watch=true` or `/watch/` paths): newline-delimited JSON events over chunked
  encoding, one chunk per event, from a bounded history; a watch from a compacted revision
  gets an ERROR event with a 410 Expired Status, one from a revision not reached yet waits.
  resourceVersion "" or "0" first sends ADDED for every current object. Selectors apply to
  events (an object that stops matching arrives as DELETED, one that starts as ADDED).
  BOOKMARKs every `bookmark_interval` seconds when asked for, and 2 s before the timeout.
- What kubectl needs: Table answers with Kubernetes' printer columns (`tables.py`, `-o wide`
  and `get --watch` too); OpenAPI v2 and v3 generated from the client's models
  (`openapi.py`: `explain`, apply's patch strategies, `fieldValidation`/`dryRun` support);
  strict field validation (`validation.py`); `dryRun=All` on every write (query or
  DeleteOptions); protobuf bodies of `create namespace`/`create service` (`protobuf.py`);
  422 Invalid with one StatusCause per field error; server-side apply with managedFields
  and conflicts (`apply.py`).
- PATCH: merge (RFC 7386), JSON patch (RFC 6902, all six operations) and strategic merge
  with the real merge keys and directives (`strategic.py`, `patch_meta.py`).
- Services are defaulted, validated and given a clusterIP, node ports and a health-check
  node port as the real registry does (`service_spec.py`; 422 Invalid otherwise), and keep
  them on updates that omit them; namespaces carry `kubernetes.io/metadata.name`; deleting a
  namespace deletes what is in it at once (no Terminating phase); creating in a missing
  namespace is 404; unknown fields and empty metadata maps are never stored.
- Pods: DELETE with `gracePeriodSeconds` > 0 only sets `metadata.deletionTimestamp` and
  `deletionGracePeriodSeconds`, as the real server does; the lab's kubelet part deletes the
  pod for good later. Without a grace period, or with 0, a pod goes at once. `pods/NAME/log`
  is read from the pod's node's kubelet port, as the real server proxies it (`pod_logs.py`).
- In-process listeners (`Store.add_listener`) see every write, in order, under the store
  lock: the lab's EndpointSlice controller (`--endpointslice-controller`) runs on them.
- Persistence (optional `state_file`): a snapshot written atomically (temp + rename) plus
  an append-only journal of every write; a restarted server keeps objects and the counter
  but starts with an empty history: watches from before the restart get 410.

Lab-only administration lives under `/_lab/` and is not Kubernetes API: `POST /_lab/compact`
(drop the history and continue snapshots) and `GET /_lab/watchers` (open watch streams).

The stdlib serves it; PyYAML reads YAML bodies, and the `kubernetes` client's models, imported
at the first write or OpenAPI request (about a second), are the types OpenAPI and field
validation are generated from. Stored objects are never mutated: every write builds new
dicts, so lists, snapshots and watch events can share them without copies. In-process
helpers return deep copies.

The package, one job a module, leaves first: `kinds.py` (the served kinds), `errors.py`
(ApiError and its Status), `objects.py` (how stored objects are shaped), `selectors.py`,
`patch.py` (merge and JSON patch), `patch_meta.py` + `strategic.py` (strategic merge),
`apply.py` (server-side apply), `openapi.py` + `openapi_proto.py` + `validation.py`,
`protobuf.py` + `bodies.py` (request bodies and what a request asks for), `tables.py`,
`persistence.py`, `strategy.py` (what a write stores, per resource), `watch.py`, `store.py`
(the state and its one lock), `builtin_objects.py` (`default/kubernetes`),
`endpoints_mirror.py`, `routing.py` and `discovery.py`, `pod_logs.py`, `watch_response.py`, `handler.py`
(HTTP requests), `server.py` (`ApiServer`) and `__main__.py` (`python -m
lab.apiserver`). This file only re-exports the names the rest of the project
imports.
"""
from lab.apiserver.errors import ApiError
from lab.apiserver.objects import Subresource
from lab.apiserver.patch import json_patch, merge_patch
from lab.apiserver.selectors import LabelSelector
from lab.apiserver.server import ApiServer
from lab.apiserver.watch import StoreEvent

__all__ = ["ApiError", "ApiServer", "LabelSelector", "StoreEvent", "Subresource", "json_patch", "merge_patch"]
