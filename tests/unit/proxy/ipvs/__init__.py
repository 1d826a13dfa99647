"""Unit tests of proxy/ipvs/ (tests mirror the source tree)."""
