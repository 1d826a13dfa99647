"""Unit tests of kernel/ (tests mirror the source tree)."""
