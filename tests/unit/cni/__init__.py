"""Unit tests of cni/ (tests mirror the source tree)."""
