"""Unit tests of policy/nftables/ (tests mirror the source tree)."""
