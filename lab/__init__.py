"""The lab: simulated Kubernetes nodes in network namespaces on this machine.

`node.py` is one node with the CNI plugin and its agent (the single-node demo and the CNI
tests use it); `apiserver/` is the Kubernetes API test server (`service_spec.py`: what it
defaults, validates and allocates for Services); `cluster.py` builds N nodes on a simulated
underlay (`physical.py`; its saved state `state.py`, its processes `processes.py`), each with its agent watching that API server, and publishes its pods as v1 Pods
(`pod_objects.py`); `endpointslice_controller.py` (running inside the API server, deciding
with `endpointslices.py`) turns Services with selectors and those pods into EndpointSlices;
`kubelet.py` is the kubelet stand-in for the Pods API clients create (agnhost only: each pod's
life in `kubelet_pod.py`, what it runs and reports in `kubelet_status.py`); `manifests.py` is `lab apply/delete -f`; `service_status.py` the services part of `lab status`;
`commands.py` the `netagent lab` CLI.

A client of the agent, beside `netagent/`, `cni/`, `proxy/` and `ebpf/`: it imports the product,
the product never imports it (but `netagent/cli.py`'s `lab` handler, lazily), and the image
ships none of it.
"""
from lab.node import LabNode, Pod

__all__ = ["LabNode", "Pod"]
