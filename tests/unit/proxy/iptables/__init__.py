"""Unit tests of proxy/iptables/ (tests mirror the source tree)."""
