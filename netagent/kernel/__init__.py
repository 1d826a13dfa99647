"""Shared kernel libraries: iptables, ipset, network namespaces, sysctls, the names netagent
owns in the kernel, the routes' vocabulary, the kernel's refusal (`errors.KernelError`) and how
pods attach to the node (`pod_attachment.PodAttachment`); `nflog`, the kernel's packet log read
over netlink, `ctevents`, conntrack's new-connection events, and `heap`, the freed heap given
back after a large sync. Each kernel seam is an interface with
a real runner and a stateful fake."""
