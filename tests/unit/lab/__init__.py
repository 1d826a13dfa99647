"""Unit tests of lab/ (tests mirror the source tree)."""
