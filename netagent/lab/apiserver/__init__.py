"""The Kubernetes API test server: the real wire protocol, in memory, stdlib only.

There is no real API server on the build machine, so the lab and the tests run this one and
the agent's unchanged client code (the official `kubernetes` client) talks to it. What it
reproduces is what a watch-based agent can observe of a real server:

- Paths, verbs and Status errors of core/v1 `nodes`, `namespaces`, `services`, `pods`,
  `endpoints` and discovery.k8s.io/v1 `endpointslices` (cluster-wide and per-namespace
  collections, objects, a `/status` subresource where the real one has it), `/version`,
  `/healthz`, `/readyz`, and enough discovery (`/api`, `/apis`, ...) for the client.
- One global resourceVersion counter, like etcd's revision. Writes that change nothing do
  not bump it and make no event, like the real server.
- list with `limit`/`continue` served from a consistent snapshot; an unknown or compacted
  continue token answers 410 Expired. Label selectors (=, ==, !=, in, notin, exists, !key,
  >, <) and field selectors (metadata.name, metadata.namespace; pods also spec.nodeName,
  status.phase; anything else is 400).
- watch (`?watch=true` or `/watch/` paths): newline-delimited JSON events over chunked
  encoding, one chunk per event. Events come from a bounded history (`history` events, all
  resources together); a watch from an older resourceVersion, or from one the server has not
  reached yet, gets HTTP 200 and an ERROR event with a 410 Expired Status. resourceVersion ""
  or "0" first sends ADDED for every current object. Selectors apply to events: an object
  that stops matching arrives as DELETED (previous content, new resourceVersion), one that
  starts matching as ADDED. BOOKMARKs every `bookmark_interval` seconds when asked for.
- PATCH: merge (RFC 7386), JSON patch (RFC 6902, all six operations) and strategic merge,
  which here is a merge patch (lists are replaced, `$patch` directives are not understood):
  good enough for annotations, labels and status, and said plainly here.
- Services are defaulted, validated and given a clusterIP, node ports and a health-check
  node port as the real registry does (`service_spec.py`; 422 Invalid otherwise), and keep
  them on updates that omit them; deleting a namespace deletes what is in it at once (no
  Terminating phase); creating in a missing namespace is 404.
- Pods: DELETE with `gracePeriodSeconds` > 0 (query or DeleteOptions body) only sets
  `metadata.deletionTimestamp` (the deadline) and `deletionGracePeriodSeconds`, as the real
  server does; the lab's kubelet part deletes the pod for good later. Without a grace
  period, or with 0, a pod goes at once (the real server would default to the pod's
  terminationGracePeriodSeconds; the lab's callers say what they want). Updates cannot
  set or clear those two fields.
- In-process listeners (`Store.add_listener`) see every write, in order, under the store
  lock: the lab's EndpointSlice controller (`--endpointslice-controller`) runs on them.
- Persistence (optional `state_file`): a snapshot written atomically (temp + rename) plus
  an append-only journal of every write, so a server killed right after a write loses
  nothing and writes stay O(1); `stop()` folds the journal into the snapshot, after which
  the snapshot alone is the state (tests may edit it). A restarted server keeps objects and
  the counter but starts with an empty history: watches from before the restart get 410,
  exactly what an API server restart with compaction looks like.

Lab-only administration lives under `/_lab/` and is not Kubernetes API: `POST /_lab/compact`
(drop the history and continue snapshots) and `GET /_lab/watchers` (open watch streams).

Stored objects are never mutated: every write builds new dicts, so lists, snapshots and
watch events can share them without copies. In-process helpers return deep copies.

The package, one job a module, leaves first: `errors.py` (ApiError and the Status it
answers), `objects.py` (how stored objects are shaped; `Subresource`), `selectors.py`
(label and field selectors, the list/watch filter), `patch.py` (merge and JSON patch),
`persistence.py` (snapshot + journal), `strategy.py` (what a write stores, per resource),
`watch.py` (store events and what each watcher sees of them), `store.py` (the objects, the
revision counter, history, watches, list snapshots: the state and its one lock),
`routing.py` and `discovery.py` (what a path addresses; what the client discovers),
`watch_response.py` (a watch's chunked response), `handler.py` (HTTP requests),
`server.py` (`ApiServer`: listeners, lifecycle, in-process helpers) and `__main__.py`
(`python -m netagent.lab.apiserver`, how the lab runs it). This file only re-exports
the names the rest of the project imports.
"""
from netagent.lab.apiserver.errors import ApiError
from netagent.lab.apiserver.objects import Subresource
from netagent.lab.apiserver.patch import json_patch, merge_patch
from netagent.lab.apiserver.selectors import LabelSelector
from netagent.lab.apiserver.server import ApiServer
from netagent.lab.apiserver.watch import StoreEvent

__all__ = ["ApiError", "ApiServer", "LabelSelector", "StoreEvent", "Subresource", "json_patch", "merge_patch"]
