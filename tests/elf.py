"""One reading of ELF headers for the tests: is an executable static (no PT_INTERP segment, so
no dynamic loader)? The CNI shim, busybox in the e2e images and the VM's initramfs must be."""
from __future__ import annotations

import struct
from pathlib import Path

PT_INTERP = 3


def has_interpreter(elf: bytes) -> bool:
    """Whether an ELF64 little-endian executable (this machine is amd64) names a program
    interpreter; anything else is refused loudly rather than judged."""
    if elf[:6] != b"\x7fELF\x02\x01":
        raise ValueError("not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    return any(struct.unpack_from("<I", elf, phoff + i * phentsize)[0] == PT_INTERP for i in range(phnum))


def is_static_elf(path: str | Path) -> bool:
    """True for a 64-bit ELF file with no PT_INTERP segment; False for anything else."""
    try:
        return not has_interpreter(Path(path).read_bytes())
    except ValueError:
        return False
