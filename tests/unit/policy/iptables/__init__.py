"""Unit tests of policy/iptables/ (tests mirror the source tree)."""
