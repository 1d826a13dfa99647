"""Unit tests of kernel/nftables/ (tests mirror the source tree)."""
