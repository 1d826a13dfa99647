"""The lab: simulated Kubernetes nodes in network namespaces on this machine.

`node.py` is one node with the CNI plugin and its agent (the single-node demo and the CNI
tests use it); `apiserver.py` is the Kubernetes API test server; `cluster.py` builds N nodes
on a simulated underlay, each with its agent watching that API server.
"""
from netagent.lab.node import LabNode, Pod

__all__ = ["LabNode", "Pod"]
