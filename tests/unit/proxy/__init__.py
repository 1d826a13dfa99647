"""Unit tests of proxy/ (tests mirror the source tree)."""
