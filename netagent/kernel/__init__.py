"""Shared kernel libraries: iptables, ipset, network namespaces, sysctls and the names netagent
owns in the kernel. Each kernel seam is an interface with a real runner and a stateful fake."""
