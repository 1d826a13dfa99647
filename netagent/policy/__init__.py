"""NetworkPolicy enforcement on this node's pod interfaces (networking.k8s.io/v1).

Modules, one job each, in the order data flows through them:
- `model`: frozen values (selectors, peers, ports, rules, policies, pods, namespaces);
- `kube_objects`: API dicts -> model values, failing closed with a sentence per bad field;
- `semantics`: pure; which policies isolate which local pod and what they allow -> `NodePlan`;
  `incremental`: the plan after a change, from the last one and only what the change reaches;
- `dataplane`: `PolicyDataplane`, the one interface the engine renders and applies through;
  `shared`: what both dataplanes share above their renderers (settings, pod chains' names,
  checked set members); `readback`: the kernel's rules as values, and the tracer;
- one sub-package per dataplane, as proxy/'s backends: `iptables/` (chains and ipsets) and
  `nftables/` (the `netagent-policy` table, a `Table` of kernel/nftables/), each a pure
  `render`, a `dataplane` that writes the difference, and a pure `readback`;
- `families`: one dataplane per IP family under one `PolicyDataplane`;
- `engine`: the watch recorders, the parsed view and the sync function a `SyncRunner` calls;
- `flows`: the pod chains' logged drops (nflog) as flow records named from the engine's plan;
  `conntrack_flows`: forwarded and Service-translated connections from conntrack events.
"""
