"""Unit tests of project/ (tests mirror the source tree)."""
