"""Compiling, loading, pinning and attaching the socket load balancer; finding and removing it.

`SocketLbLoader.ensure_loaded()` compiles ebpf/sock_lb.c with bcc, in a process of its own
(ebpf/compiler.py: the agent never maps LLVM; the programs come back as descriptors, which this
module attaches with plain bpf(2) and netlink calls; the pinned maps under
`<bpf root>/netagent-v1/` are reused when they exist, created and pinned when not, so a
restarted agent keeps the dataplane's state), loads the eight CGROUP_SOCK_ADDR programs (IPv4's
and IPv6's: ebpf/sock_lb6.c, compiled with it over maps of its own) and
attaches them to the cgroup it was given, in multi-program mode so other users of the cgroup
are not displaced. A program of ours already attached with the same tag (the kernel's hash of
its instructions, map references masked) is kept and nothing is attached: an agent restart
with unchanged code writes nothing. A different one of ours is replaced atomically
(BPF_F_REPLACE), never detached first, so connections are never left unbalanced.

The tc path is composed of several files, in this order: nodeport.c (IPv4's packet helpers),
nodeport_flow.c with its `__F` suffixes removed (IPv4's flow logic), nodeport6.c (IPv6's),
nodeport_flow.c with `__F` made `6` (IPv6's flow logic), nodeport_progs.c (the programs, which
dispatch by family): one text, one compilation, one set of tc programs for both families.

Map capacities come from `sizes` (ebpf/sizes.py, `--bpf-map-max`), passed to bcc as defines. A
pinned map whose capacity differs (an earlier run with other sizes) is recreated: its pin is
removed before compiling (bcc then creates and pins the new one), its entries are copied into
the new map when they fit (an LRU map takes what it can; a hash map that would overflow is
left empty for the backend's first full sync, which writes what fits and rejects the rest),
and the programs are re-attached even when their code is unchanged, since the old ones use
the old maps. A pinned map whose key or value size differs from ebpf/maps.py's layout (an
earlier version's struct, e.g. `na_ct` before it tracked sequence numbers) is recreated the same
way, empty: its entries cannot be copied. `LoadReport.resized` says what was recreated.

Safety: the bpf root must be a bpffs mount and the cgroup a cgroup v2 directory, both named
by the caller (`--bpf-root`, `--cgroup-root`); nothing is guessed, and programs are found by
our name prefix (netagent.kernel.owned.BPF_NAME_PREFIX) on that cgroup only.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from ebpf import syscall
from ebpf.compiler import CompileError, ProgramSpec, compile_and_load
from ebpf.maps import FLOW_MAPS, LAYOUTS, LRU_MAPS, PINNED_NAMES, RETIRED_MAPS
from ebpf.mapset import MapSet
from ebpf.sizes import DEFAULT_SIZES, MapSizes
from netagent.kernel.owned import BPF_NAME_PREFIX, BPF_PIN_SUBDIR
from netagent.errors import NetagentError

SOURCE = Path(__file__).with_name("sock_lb.c")
SOURCE6 = Path(__file__).with_name("sock_lb6.c")   # compiled after SOURCE: it uses its helpers
TC_SOURCE = Path(__file__).with_name("nodeport.c")   # compiled after SOURCE: it uses its maps
TC_SOURCE6 = Path(__file__).with_name("nodeport6.c")
TC_FLOW = Path(__file__).with_name("nodeport_flow.c")   # the tc flow logic, once per family
TC_PROGRAMS_SOURCE = Path(__file__).with_name("nodeport_progs.c")
FLOW_SUFFIXES = ("", "6")   # what `__F` in TC_FLOW becomes: IPv4's names, then IPv6's
PROG_TYPE_SCHED_CLS = 3
TC_PROGRAMS = ("na_tc_ingress", "na_tc_egress", "na_tc_from_pod")
PROG_TYPE_CGROUP_SOCK_ADDR = 18

# program name -> attach type (linux/bpf.h enum bpf_attach_type)
PROGRAMS = {
    "na_connect4": 10,       # BPF_CGROUP_INET4_CONNECT
    "na_sendmsg4": 14,       # BPF_CGROUP_UDP4_SENDMSG
    "na_recvmsg4": 19,       # BPF_CGROUP_UDP4_RECVMSG
    "na_getpeername4": 29,   # BPF_CGROUP_INET4_GETPEERNAME
    "na_connect6": 11,       # BPF_CGROUP_INET6_CONNECT
    "na_sendmsg6": 15,       # BPF_CGROUP_UDP6_SENDMSG
    "na_recvmsg6": 20,       # BPF_CGROUP_UDP6_RECVMSG
    "na_getpeername6": 30,   # BPF_CGROUP_INET6_GETPEERNAME
}
CGROUP_SPECS = tuple(ProgramSpec(name, PROG_TYPE_CGROUP_SOCK_ADDR, attach_type)
                     for name, attach_type in PROGRAMS.items())
TC_SPECS = tuple(ProgramSpec(name, PROG_TYPE_SCHED_CLS) for name in TC_PROGRAMS)
ATTACH_TYPE_NAMES = {10: "connect4", 14: "sendmsg4", 19: "recvmsg4", 29: "getpeername4",
                     11: "connect6", 15: "sendmsg6", 20: "recvmsg6", 30: "getpeername6"}


class EbpfError(NetagentError):
    pass


def has_set_retval(release: str | None = None) -> bool:
    """bpf_set_retval exists from kernel 5.18; older kernels refuse with EPERM instead."""
    release = release or os.uname().release
    try:
        major, minor = (int(part) for part in release.split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 18)


def pin_dir(bpf_root: str) -> str:
    return os.path.join(bpf_root, BPF_PIN_SUBDIR)


def check_bpf_root(bpf_root: str) -> None:
    if not os.path.isdir(bpf_root):
        raise EbpfError(f"--bpf-root {bpf_root}: not a directory")
    if syscall.fs_magic(bpf_root) != syscall.BPF_FS_MAGIC:
        raise EbpfError(f"--bpf-root {bpf_root}: not a bpffs mount (mount -t bpf bpf {bpf_root})")


def cgroup2_directory(path: str) -> str:
    """The cgroup v2 directory `--cgroup-root` names: `path` itself, or on a hybrid host (v1
    controllers under /sys/fs/cgroup, v2 at /sys/fs/cgroup/unified) its `unified` directory, so
    one manifest's `--cgroup-root=<the host's /sys/fs/cgroup>` serves both layouts."""
    unified = os.path.join(path, "unified")
    if (os.path.isdir(path) and syscall.fs_magic(path) != syscall.CGROUP2_SUPER_MAGIC and os.path.isdir(unified)
            and syscall.fs_magic(unified) == syscall.CGROUP2_SUPER_MAGIC):
        return unified
    return path


def check_cgroup(cgroup: str) -> None:
    if not os.path.isdir(cgroup):
        raise EbpfError(f"--cgroup-root {cgroup}: not a directory")
    if syscall.fs_magic(cgroup) != syscall.CGROUP2_SUPER_MAGIC:
        raise EbpfError(f"--cgroup-root {cgroup}: not a cgroup v2 directory")


@dataclass(frozen=True)
class AttachedProgram:
    attach_type: str
    id: int
    name: str
    tag: str

    @property
    def ours(self) -> bool:
        return self.name.startswith(BPF_NAME_PREFIX)


@dataclass(frozen=True)
class LoadReport:
    compile_seconds: float   # bcc's process: C to BPF, maps created or opened, programs through the verifier
    load_seconds: float      # attaching
    attached: tuple[str, ...]   # programs newly attached or replaced
    kept: tuple[str, ...]       # programs found attached with the same code
    resized: tuple[str, ...] = ()   # pinned maps recreated at another capacity (or retired), one line each


def _cgroup_fd(cgroup: str) -> int:
    return os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)


def _attached(cg_fd: int, attach_type: int) -> list[tuple[int, syscall.ProgInfo]]:
    """(fd, info) of every program attached at `attach_type`; the caller closes the fds."""
    found = []
    for prog_id in syscall.prog_query(cg_fd, attach_type):
        try:
            fd = syscall.prog_fd_by_id(prog_id)
        except syscall.BpfError:
            continue   # detached meanwhile
        found.append((fd, syscall.prog_info(fd)))
    return found


def attached_programs(cgroup: str) -> list[AttachedProgram]:
    cg_fd = _cgroup_fd(cgroup)
    try:
        out = []
        for attach_type, label in ATTACH_TYPE_NAMES.items():
            for fd, info in _attached(cg_fd, attach_type):
                os.close(fd)
                out.append(AttachedProgram(label, info.id, info.name, info.tag))
        return out
    finally:
        os.close(cg_fd)


def detach_owned(cgroup: str) -> list[str]:
    """Detach every program of ours from `cgroup`; what was detached."""
    if not os.path.isdir(cgroup):
        return []
    cg_fd = _cgroup_fd(cgroup)
    removed = []
    try:
        for attach_type, label in ATTACH_TYPE_NAMES.items():
            for fd, info in _attached(cg_fd, attach_type):
                try:
                    if info.name.startswith(BPF_NAME_PREFIX):
                        syscall.prog_detach(cg_fd, fd, attach_type)
                        removed.append(f"bpf program {info.name} ({label}) on {cgroup}")
                finally:
                    os.close(fd)
    finally:
        os.close(cg_fd)
    return removed


def remove_pins(bpf_root: str) -> list[str]:
    """Unpin every map of ours under `bpf_root` and the directory; what was removed."""
    directory = pin_dir(bpf_root)
    removed = []
    for name in (*PINNED_NAMES, *FLOW_MAPS, *RETIRED_MAPS):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            os.unlink(path)
            removed.append(f"pinned map {path}")
    if os.path.isdir(directory) and not os.listdir(directory):
        os.rmdir(directory)
    return removed


class SocketLbLoader:
    def __init__(self, *, bpf_root: str, cgroup: str, set_retval: bool | None = None,
                 tc_device: str | None = None, pod_veths: bool = False, sizes: MapSizes = DEFAULT_SIZES):
        self.sizes = sizes
        self.bpf_root = bpf_root
        self.cgroup = cgroup
        self.tc_device = tc_device   # where the tc path is attached (None: not attached)
        self.pod_veths = pod_veths   # keep the pod veths' programs for ebpf/pod_veths.py
        self.pod_veth_fds: dict[str, int] = {}   # duplicates the caller owns (and closes)
        self.set_retval = has_set_retval() if set_retval is None else set_retval

    @property
    def pin_dir(self) -> str:
        return pin_dir(self.bpf_root)

    def source(self) -> str:
        if any(ch in self.pin_dir for ch in '"\\\n'):
            raise EbpfError(f"--bpf-root {self.bpf_root}: quotes, backslashes and newlines are not allowed")
        defines = [f'#define NA_PIN_DIR "{self.pin_dir}"']
        if self.set_retval:
            defines.append("#define NA_HAVE_SET_RETVAL 1")
        defines += self.sizes.defines()
        flow = TC_FLOW.read_text()
        return "\n".join([*defines, SOURCE.read_text(), SOURCE6.read_text(),
                          TC_SOURCE.read_text(), flow.replace("__F", FLOW_SUFFIXES[0]),
                          TC_SOURCE6.read_text(), flow.replace("__F", FLOW_SUFFIXES[1]),
                          TC_PROGRAMS_SOURCE.read_text()])

    def ensure_loaded(self) -> LoadReport:
        check_bpf_root(self.bpf_root)
        check_cgroup(self.cgroup)
        os.makedirs(self.pin_dir, mode=0o700, exist_ok=True)
        started = time.monotonic()
        with_tc = bool(self.tc_device or self.pod_veths)
        fds, resized = self._compile([*CGROUP_SPECS, *(TC_SPECS if with_tc else ())])
        compiled_at = time.monotonic()
        attached, kept = [], []
        try:
            cg_fd = _cgroup_fd(self.cgroup)
            try:
                for name, attach_type in PROGRAMS.items():
                    if self._attach(cg_fd, fds[name], name, attach_type, force=bool(resized)):
                        attached.append(name)
                    else:
                        kept.append(name)
            finally:
                os.close(cg_fd)
            if self.tc_device:
                from ebpf.tc import attach_tc
                try:
                    attach_tc(self.tc_device, fds)
                except Exception as error:
                    raise EbpfError(f"attaching the tc programs to {self.tc_device}: {error}") from None
                attached += [f"{name} on {self.tc_device}" for name in ("na_tc_ingress", "na_tc_egress")]
            if self.pod_veths:
                from ebpf.pod_veths import PROGRAMS as POD_VETH_PROGRAMS
                self.pod_veth_fds = {name: os.dup(fds[name]) for name in POD_VETH_PROGRAMS}
        finally:
            for fd in fds.values():   # the programs stay alive while attached, the maps while pinned
                os.close(fd)
        for name in RETIRED_MAPS:   # an earlier version's, unused once its programs are replaced
            path = os.path.join(self.pin_dir, name)
            if os.path.exists(path):
                os.unlink(path)
                resized.append(f"{name}: retired, unpinned")
        return LoadReport(compile_seconds=compiled_at - started, load_seconds=time.monotonic() - compiled_at,
                          attached=tuple(attached), kept=tuple(kept), resized=tuple(resized))

    def _compile(self, programs: list[ProgramSpec]) -> tuple[dict[str, int], list[str]]:
        """`programs` compiled and loaded by bcc's own process (ebpf/compiler.py) over our pinned
        maps: name -> descriptor (the caller closes them), and what was recreated at another
        capacity."""
        old = self._unpin_resized()
        try:
            try:
                fds = compile_and_load(self.source(), programs)
            except CompileError as error:
                for name, (fd, before) in old.items():   # the old maps stay (pinned again where bcc left none)
                    if not os.path.exists(os.path.join(self.pin_dir, name)):
                        syscall.obj_pin(fd, os.path.join(self.pin_dir, name))
                    else:   # bcc made the new map before the kernel refused a program: keep the entries
                        self._refill(name, fd, before)
                what = f"loading {error.program}" if error.program else f"compiling {SOURCE.name}"
                raise EbpfError(f"{what}: {error.detail}") from None
            return fds, [self._refill(name, fd, before) for name, (fd, before) in old.items()]
        finally:
            for fd, _ in old.values():
                os.close(fd)

    def _unpin_resized(self) -> dict[str, tuple[int, int]]:
        """Unpin each map of ours whose capacity is not the wanted one; map name -> (an fd that
        keeps the old map alive for the copy, its capacity)."""
        old: dict[str, tuple[int, int]] = {}
        for name, wanted in self.sizes.max_entries.items():
            path = os.path.join(self.pin_dir, name)
            if not os.path.exists(path):
                continue
            fd = syscall.obj_get(path)
            info = syscall.map_info(fd)
            before = info.max_entries
            if before == wanted and self._same_layout(name, info):
                os.close(fd)
                continue
            os.unlink(path)
            old[name] = (fd, before)
        return old

    @staticmethod
    def _same_layout(name: str, info: syscall.MapInfo) -> bool:
        """The pinned map's key and value sizes are today's (maps without a layout: assumed so)."""
        layout = LAYOUTS.get(name)
        return layout is None or (info.key_size, info.value_size) == (layout.key_size, layout.value_size)

    def _refill(self, name: str, old_fd: int, before: int) -> str:
        """Copy the old map's entries into the new pinned one, when they fit; one line for the log."""
        info = syscall.map_info(old_fd)
        if not self._same_layout(name, info):
            return f"{name}: its entries' layout changed ({info.key_size}+{info.value_size} bytes), recreated empty"
        entries = syscall.map_read_all(old_fd, info.key_size, info.value_size)
        wanted = self.sizes[name]
        if len(entries) > wanted and name not in LRU_MAPS:
            return f"{name}: {before} -> {wanted} entries; its {len(entries)} entries do not fit, left to the sync"
        new_fd = syscall.obj_get(os.path.join(self.pin_dir, name))
        try:
            syscall.map_update_batch(new_fd, list(entries.items()))
        finally:
            os.close(new_fd)
        return f"{name}: {before} -> {wanted} entries, {len(entries)} copied"

    def _attach(self, cg_fd: int, prog_fd: int, name: str, attach_type: int, *, force: bool = False) -> bool:
        """Attach `prog_fd` unless the same code of ours is there (and not `force`d: maps were
        recreated); True when something was written."""
        tag = syscall.prog_info(prog_fd).tag
        present = _attached(cg_fd, attach_type)
        try:
            ours = [(fd, info) for fd, info in present if info.name == name]
            if not force and any(info.tag == tag for _, info in ours) and len(ours) == 1:
                return False
            try:
                syscall.prog_attach(cg_fd, prog_fd, attach_type, replace_fd=ours[0][0] if ours else 0)
            except syscall.BpfError as error:
                raise EbpfError(f"attaching {name} to {self.cgroup}: {error.strerror}") from None
            for fd, _ in ours[1:]:
                syscall.prog_detach(cg_fd, fd, attach_type)
            return True
        finally:
            for fd, _ in present:
                os.close(fd)

    def maps(self) -> MapSet:
        return MapSet.open_pinned(self.pin_dir)

    def load_tc(self) -> TcPrograms:
        """The tc programs loaded (not attached), over the same pinned maps; the caller closes
        them (tests attach them themselves; the agent attaches through `ensure_loaded`)."""
        check_bpf_root(self.bpf_root)
        os.makedirs(self.pin_dir, mode=0o700, exist_ok=True)
        fds, _ = self._compile(list(TC_SPECS))
        return TcPrograms(fds)


class TcPrograms:
    """Loaded tc programs by name (file descriptors), alive until `close()`."""

    def __init__(self, fds: dict[str, int]):
        self.fds = fds

    def close(self) -> None:
        fds, self.fds = self.fds, {}
        for fd in fds.values():
            os.close(fd)

    def __enter__(self) -> TcPrograms:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
