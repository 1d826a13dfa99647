"""Unit tests of infra/ (tests mirror the source tree)."""
