"""Unit tests of noderoutes/bgp/ (tests mirror the source tree)."""
