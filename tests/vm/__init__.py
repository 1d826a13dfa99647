"""The VM tier: tests that need Debian's kernel (IPIP, IPVS), run inside qemu by tests/vm/qemu.py."""
