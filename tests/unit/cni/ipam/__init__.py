"""Unit tests of cni/ipam/ (tests mirror the source tree)."""
