"""The eBPF service-proxy backend: socket-level load balancing programmed as BPF maps.

`render.py` turns a ProxyState into map entries (pure), `backend.py` (`EbpfProxy`) diffs them
against the maps and writes the difference in batches, `readback.py` turns the maps back into
what `netagent status services` shows, `flows.py` (`EbpfFlows`) reads the socket LB's ring buffer
of translations and refusals into flow records. The programs, their loader and the map views live in
the top-level `ebpf/` package.
"""
