"""Unit tests of deploy/ (tests mirror the source tree)."""
