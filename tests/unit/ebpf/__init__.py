"""Unit tests of ebpf/ (tests mirror the source tree)."""
