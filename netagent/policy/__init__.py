"""NetworkPolicy enforcement on this node's pod interfaces (networking.k8s.io/v1).

Modules, one job each, in the order data flows through them:
- `model`: frozen values (selectors, peers, ports, rules, policies, pods, namespaces);
- `kube_objects`: API dicts -> model values, failing closed with a sentence per bad field;
- `semantics`: pure; which policies isolate which local pod and what they allow -> `NodePlan`;
- `render`: pure; a plan -> the chains (iptables-save form) and ipsets the kernel should hold;
- `programmer`: writes the difference through the kernel layer's `Iptables` and `Ipset`;
- `engine`: the watch recorders, the parsed view and the sync function a `SyncRunner` calls.
"""
