"""Unit tests of daemon/ (tests mirror the source tree)."""
