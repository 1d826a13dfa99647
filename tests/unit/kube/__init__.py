"""Unit tests of kube/ (tests mirror the source tree)."""
