"""netagent: a Kubernetes node network agent (CNI plugin, pod routing, service proxy)."""

__version__ = "0.1.0"
