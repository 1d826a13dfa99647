"""The netagent CNI plugin.

Everything a container runtime touches lives here: the spec types (config, result, errors),
the thin client the runtime executes, the ADD/DEL/CHECK/GC/STATUS handlers, pod wiring
and IPAM. Modules the thin client imports (`client`, `errors`, `version`) use the standard
library only, so the binary starts in milliseconds; everything that needs netlink is
imported lazily, on the agent side or on the in-process fallback path.
"""
