"""Unit tests of policy/ (tests mirror the source tree)."""
