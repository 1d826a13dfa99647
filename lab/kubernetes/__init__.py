"""A real Kubernetes in the lab: its components built from the upstream Go modules
(scripts/build-kubernetes), run in the lab's namespaces."""
