"""Unit tests of noderoutes/routing/ (tests mirror the source tree)."""
