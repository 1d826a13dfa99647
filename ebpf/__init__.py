"""eBPF sources, loader and typed map wrappers for the eBPF service backend."""
