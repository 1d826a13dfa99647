"""Unit tests of proxy/ebpf/ (tests mirror the source tree)."""
