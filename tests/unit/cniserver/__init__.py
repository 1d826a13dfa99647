"""Unit tests of cniserver/ (tests mirror the source tree)."""
