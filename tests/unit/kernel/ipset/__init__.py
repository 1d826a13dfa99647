"""Unit tests of kernel/ipset/ (tests mirror the source tree)."""
