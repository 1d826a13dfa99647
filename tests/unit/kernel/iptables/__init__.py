"""Unit tests of kernel/iptables/ (tests mirror the source tree)."""
