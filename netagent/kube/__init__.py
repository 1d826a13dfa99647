"""How netagent learns the cluster from the Kubernetes API.

`config` builds the official client's `ApiClient` (kubeconfig or in-cluster) and sends raw
JSON requests over it; `resources` names the API resources and their paths; `reflector`
keeps a local copy of one resource (list, then watch) and tells a handler what changed;
`nodes` holds the few Node reads and writes the agent makes. `labels` is the API's label
syntax, checked again where a selector's text names kernel state. Objects are plain dicts
parsed from JSON, never the client's model classes (four times slower at scale).
"""
