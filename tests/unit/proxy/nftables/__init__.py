"""Unit tests of proxy/nftables/ (tests mirror the source tree)."""
