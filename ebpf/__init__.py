"""eBPF sources, their compiler (bcc, in a child process), loader and typed map wrappers for the eBPF
service backend."""
