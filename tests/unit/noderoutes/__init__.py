"""Unit tests of noderoutes/ (tests mirror the source tree)."""
