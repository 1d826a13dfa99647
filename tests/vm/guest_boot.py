"""The guest's boot files for the VM tier (`qemu.py` runs them): Debian's kernel and an initramfs.

* Kernel: `find_guest_kernel()` takes the newest /boot/vmlinuz-* whose /lib/modules holds the
  9p modules. The bzImage is xz-compressed, and decompressing it under TCG costs about 5 s of
  every boot, so the harness decompresses it once on the host and boots the resulting ELF
  `vmlinux` through its PVH entry point (qemu's `-kernel` accepts that). A kernel without a PVH
  note is booted as the bzImage.
* Initramfs: busybox-static plus the few modules needed to reach the shared root (virtio_pci,
  9pnet_virtio, 9p with netfs/fscache, overlay), resolved with their dependencies from
  modules.dep. It is built in Python (cpio "newc") and cached under
  /var/tmp/netagent-vm/<kernel version>/, keyed by a digest of everything it is made of, so a
  change of kernel, busybox or init script rebuilds it. Nothing is written into the repository.
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import lzma
import os
import re
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Iterable

BUSYBOX = Path("/bin/busybox")
BOOT_DIR = Path("/boot")
MODULES_ROOT = Path("/lib/modules")
CACHE_ROOT = Path("/var/tmp/netagent-vm")
GUEST_SHARE = "/run/netagent-vm"
SHARE_TAG = "netagent-share"
ROOT_TAG = "hostroot"
# What the initramfs loads to reach the shared root; dependencies come from modules.dep.
BOOT_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
NINEP_OPTIONS = "trans=virtio,version=9p2000.L,msize=512000"
STATUS_PREFIX = "NETAGENT-VM"


class VmUnavailable(RuntimeError):
    """The tools the tier needs are not installed; the message says which."""


@dataclasses.dataclass(frozen=True)
class GuestKernel:
    version: str
    vmlinuz: Path
    modules_dir: Path


# --------------------------------------------------------------------------- discovery

def _version_key(version: str) -> list:
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.\-+~]", version)]


def _has_boot_modules(modules_dir: Path) -> bool:
    dep = modules_dir / "modules.dep"
    if not dep.is_file():
        return False
    names = {_module_name(line.split(":", 1)[0]) for line in dep.read_text().splitlines()}
    return all(name in names for name in BOOT_MODULES)


def find_guest_kernel() -> GuestKernel | None:
    """The newest /boot/vmlinuz-* whose /lib/modules/<version> holds the 9p and virtio modules."""
    candidates = []
    for image in BOOT_DIR.glob("vmlinuz-*"):
        version = image.name[len("vmlinuz-"):]
        modules_dir = MODULES_ROOT / version
        if _has_boot_modules(modules_dir):
            candidates.append(GuestKernel(version=version, vmlinuz=image, modules_dir=modules_dir))
    return max(candidates, key=lambda k: _version_key(k.version), default=None)


# --------------------------------------------------------------------------- modules

def _module_name(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    return re.sub(r"\.ko(\.xz|\.gz|\.zst)?$", "", base).replace("-", "_")


def resolve_module_paths(names: Iterable[str], modules_dir: Path) -> list[str]:
    """Relative .ko paths for `names` and their dependencies, in load order (dependencies first)."""
    deps: dict[str, tuple[str, list[str]]] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        path, _, needed = line.partition(":")
        deps[_module_name(path)] = (path, [_module_name(p) for p in needed.split()])
    ordered: list[str] = []

    def visit(name: str) -> None:
        key = name.replace("-", "_")
        if key not in deps:
            raise VmUnavailable(f"module {name} is not in {modules_dir}/modules.dep")
        path, needed = deps[key]
        # modules.dep lists the deepest dependency last; load from the end.
        for dep in reversed(needed):
            visit(dep)
        if path not in ordered:
            ordered.append(path)

    for name in names:
        visit(name)
    return ordered


def _read_module(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        return lzma.decompress(data)
    if path.name.endswith(".gz"):
        return gzip.decompress(data)
    if path.name.endswith(".zst"):
        raise VmUnavailable(f"{path}: zstd-compressed modules are not supported by the harness")
    return data


# --------------------------------------------------------------------------- initramfs

INIT_SCRIPT = r"""#!/bin/busybox sh
# netagent VM tier init: reach the host's root over 9p, overlay it with a tmpfs, run the job.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
stty -F /dev/ttyS1 raw -echo
stty -F /dev/ttyS2 raw -echo
status() { echo "@STATUS@ $*" > /dev/ttyS2; }
fail() { echo "init: $*" > /dev/console; status init-failed "$*"; poweroff -f; sleep 5; exit 1; }
for module in $(cat /modules.order); do
  insmod "/modules/$module" || fail "insmod $module"
done
fresh_tmp=
for word in $(cat /proc/cmdline); do
  case "$word" in netagent.fresh_tmp=*) fresh_tmp=$(echo "${word#*=}" | tr , ' ');; esac
done
mkdir -p /lower /upper /newroot
mount -t 9p -o @NINEP@,cache=loose,ro @ROOT_TAG@ /lower || fail "mount the host root (9p)"
mount -t tmpfs -o mode=0755 upper /upper || fail "mount the overlay's tmpfs"
mkdir -p /upper/data /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay /newroot \
  || fail "mount the overlay"
cd /newroot
mount -t proc proc proc && mount -t sysfs sysfs sys && mount -t devtmpfs devtmpfs dev \
  || fail "mount proc, sys, dev"
mkdir -p dev/pts dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts dev/pts
mount -t tmpfs -o mode=1777 shm dev/shm
mount -t tmpfs -o mode=0755 run run || fail "mount /run"
mkdir -p run/lock "run/netagent-vm"
mount -t 9p -o @NINEP@,cache=none @SHARE_TAG@ "./@GUEST_SHARE@" || fail "mount the job share (9p)"
for dir in $fresh_tmp; do mount -t tmpfs -o mode=1777 tmp "./$dir" || fail "mount $dir"; done
mount -t bpf bpf sys/fs/bpf 2>/dev/null
mkdir -p sys/fs/cgroup && mount -t tmpfs -o mode=0755 cgroup sys/fs/cgroup \
  && mkdir -p sys/fs/cgroup/unified && mount -t cgroup2 cgroup2 sys/fs/cgroup/unified
hostname netagent-vm
ip link set lo up
status booted
chroot /newroot /bin/sh "@GUEST_SHARE@/job.sh" </dev/null >/dev/ttyS1 2>&1
status exit $?
poweroff -f
sleep 5
"""


# The kernel runs /sbin/modprobe in the initramfs root for on-demand module loads.
MODPROBE_SHIM = """#!/bin/busybox sh
exec /bin/busybox chroot /newroot /sbin/modprobe "$@"
"""


def render_init_script() -> str:
    return (INIT_SCRIPT.replace("@STATUS@", STATUS_PREFIX).replace("@NINEP@", NINEP_OPTIONS)
            .replace("@ROOT_TAG@", ROOT_TAG).replace("@SHARE_TAG@", SHARE_TAG)
            .replace("@GUEST_SHARE@", GUEST_SHARE))


def render_cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A cpio "newc" archive of (path, mode, data) entries; directories have data b""."""
    out = io.BytesIO()

    def write(name: str, mode: int, data: bytes, ino: int) -> None:
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out.write(b"070701" + b"".join(b"%08X" % f for f in fields) + encoded)
        out.write(b"\0" * (-(110 + len(encoded)) % 4))
        out.write(data)
        out.write(b"\0" * (-len(data) % 4))

    for ino, (name, mode, data) in enumerate(entries, start=1):
        write(name, mode, data, ino)
    write("TRAILER!!!", 0, b"", 0)
    return out.getvalue()


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def cache_dir(kernel: GuestKernel) -> Path:
    return CACHE_ROOT / kernel.version


def ensure_initramfs(kernel: GuestKernel) -> Path:
    """Build (or reuse) the cached initramfs for `kernel`; rebuilt when any input changes."""
    module_paths = resolve_module_paths(BOOT_MODULES, kernel.modules_dir)
    init = render_init_script().encode()
    busybox = BUSYBOX.read_bytes()
    modules = [(p, _read_module(kernel.modules_dir / p)) for p in module_paths]
    shim = MODPROBE_SHIM.encode()
    digest = hashlib.sha256(init + shim + busybox)
    for path, data in modules:
        digest.update(path.encode() + hashlib.sha256(data).digest())
    target = cache_dir(kernel) / f"initramfs-{digest.hexdigest()[:16]}.cpio"
    if target.exists():
        return target
    names = [_module_name(p) + ".ko" for p, _ in modules]
    entries = [("bin", 0o40755, b""), ("dev", 0o40755, b""), ("proc", 0o40755, b""),
               ("sys", 0o40755, b""), ("modules", 0o40755, b""), ("sbin", 0o40755, b""),
               ("sbin/modprobe", 0o100755, shim),
               ("bin/busybox", 0o100755, busybox), ("init", 0o100755, init),
               ("modules.order", 0o100644, "".join(n + "\n" for n in names).encode())]
    entries += [(f"modules/{name}", 0o100644, data) for name, (_, data) in zip(names, modules)]
    _atomic_write(target, render_cpio(entries))
    for stale in target.parent.glob("initramfs-*.cpio"):
        if stale != target:
            stale.unlink(missing_ok=True)
    return target


# --------------------------------------------------------------------------- kernel image

def _has_pvh_note(elf: bytes) -> bool:
    """True when the ELF carries XEN_ELFNOTE_PHYS32_ENTRY (18), which qemu's PVH loader needs."""
    phoff, = struct.unpack_from("<Q", elf, 32)
    phentsize, phnum = struct.unpack_from("<HH", elf, 54)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", elf, phoff + i * phentsize)
        if p_type != 4:  # PT_NOTE
            continue
        pos, end = p_offset, p_offset + p_filesz
        while pos + 12 <= end:
            namesz, descsz, note_type = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12:pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and note_type == 18:
                return True
            pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def _decompress_bzimage(image: bytes) -> bytes | None:
    """The ELF vmlinux inside an xz- or gzip-compressed bzImage, or None."""
    decompressors = ((b"\xfd7zXZ\x00", lambda d: lzma.LZMADecompressor().decompress(d)),
                     (b"\x1f\x8b\x08", lambda d: zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(d)))
    for magic, decompress in decompressors:
        start = image.find(magic)
        if start < 0:
            continue
        try:
            elf = decompress(image[start:])
        except (lzma.LZMAError, zlib.error):
            continue
        if elf[:4] == b"\x7fELF":
            return elf
    return None


def ensure_boot_image(kernel: GuestKernel) -> Path:
    """The image qemu boots: a cached decompressed PVH vmlinux when possible, else the bzImage."""
    stat = kernel.vmlinuz.stat()
    stamp = f"{stat.st_size}-{int(stat.st_mtime)}"
    target = cache_dir(kernel) / f"vmlinux-{stamp}"
    unusable = cache_dir(kernel) / f"vmlinux-{stamp}.unusable"
    if target.exists():
        return target
    if unusable.exists():
        return kernel.vmlinuz
    elf = _decompress_bzimage(kernel.vmlinuz.read_bytes())
    if elf is None or not _has_pvh_note(elf):
        _atomic_write(unusable, b"")
        return kernel.vmlinuz
    _atomic_write(target, elf)
    for stale in target.parent.glob("vmlinux-*"):
        if stale != target:
            stale.unlink(missing_ok=True)
    return target
