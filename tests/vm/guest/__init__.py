"""Guest-side tests: they run inside the VM tier's guest, where Debian's kernel has IPIP and IPVS."""
