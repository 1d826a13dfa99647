"""The bpf(2) system call, the few commands netagent needs, through ctypes.

bcc compiles and loads programs; everything after that works from file descriptors alone, so
a restarted agent, `netagent status bpf` and `netagent cleanup` can open what is pinned, read
and write maps in batches, list and detach programs attached to a cgroup, and run a program
under BPF_PROG_TEST_RUN, without compiling anything. Each `bpf_attr` layout below is the
prefix of the kernel's union member for that command (linux/bpf.h); the kernel accepts a
shorter attr and zero-fills the rest. Errors raise `BpfError` with the errno and the command.
"""
from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from netagent.errors import NetagentError

_SYS_BPF = 321   # x86_64
_libc = ctypes.CDLL(None, use_errno=True)

MAP_LOOKUP_ELEM, MAP_UPDATE_ELEM, MAP_DELETE_ELEM, MAP_GET_NEXT_KEY = 1, 2, 3, 4
OBJ_PIN, OBJ_GET = 6, 7
PROG_ATTACH, PROG_DETACH, PROG_TEST_RUN = 8, 9, 10
PROG_GET_FD_BY_ID, MAP_GET_FD_BY_ID, OBJ_GET_INFO_BY_FD, PROG_QUERY = 13, 14, 15, 16
MAP_LOOKUP_BATCH, MAP_UPDATE_BATCH, MAP_DELETE_BATCH = 24, 26, 27

F_ALLOW_MULTI = 1 << 1
F_REPLACE = 1 << 2

_NO_BATCH = (errno.EINVAL, errno.EOPNOTSUPP, 524)   # 524: ENOTSUPP, a map type without batch ops (LPM trie)

BPF_FS_MAGIC = 0xCAFE4A11
CGROUP2_SUPER_MAGIC = 0x63677270


class BpfError(NetagentError, OSError):
    pass


def _call(cmd: int, attr: ctypes.Array) -> int:
    result = _libc.syscall(_SYS_BPF, cmd, attr, len(attr))
    if result < 0:
        code = ctypes.get_errno()
        raise BpfError(code, f"bpf command {cmd}: {os.strerror(code)}")
    return result


def _attr(fmt: str, *values) -> ctypes.Array:
    packed = struct.pack(fmt, *values)
    return ctypes.create_string_buffer(packed, max(len(packed), 8))


def _addr(buffer) -> int:
    return ctypes.addressof(buffer) if buffer is not None else 0


# ---- pinning ------------------------------------------------------------------------------------

def obj_pin(fd: int, path: str) -> None:
    name = ctypes.create_string_buffer(os.fsencode(path))
    _call(OBJ_PIN, _attr("=QII", _addr(name), fd, 0))


def obj_get(path: str) -> int:
    name = ctypes.create_string_buffer(os.fsencode(path))
    return _call(OBJ_GET, _attr("=QII", _addr(name), 0, 0))


def fs_magic(path: str) -> int:
    """The f_type of the filesystem holding `path` (statfs(2))."""
    buf = ctypes.create_string_buffer(128)
    if _libc.statfs(os.fsencode(path), buf) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"statfs {path}: {os.strerror(code)}")
    return struct.unpack_from("=q", buf, 0)[0] & 0xFFFFFFFF


# ---- programs on a cgroup -----------------------------------------------------------------------

def prog_attach(target_fd: int, prog_fd: int, attach_type: int, *, flags: int = F_ALLOW_MULTI,
                replace_fd: int = 0) -> None:
    if replace_fd:
        flags |= F_REPLACE
    _call(PROG_ATTACH, _attr("=IIIII", target_fd, prog_fd, attach_type, flags, replace_fd))


def prog_detach(target_fd: int, prog_fd: int, attach_type: int) -> None:
    _call(PROG_DETACH, _attr("=IIIII", target_fd, prog_fd, attach_type, 0, 0))


def prog_query(target_fd: int, attach_type: int, *, capacity: int = 64) -> list[int]:
    """The ids of the programs attached to `target_fd` at `attach_type`."""
    ids = (ctypes.c_uint32 * capacity)()
    attr = _attr("=IIIIQI4x", target_fd, attach_type, 0, 0, ctypes.addressof(ids), capacity)
    _call(PROG_QUERY, attr)
    count = struct.unpack_from("=I", attr, 24)[0]
    return list(ids[:count])


def prog_fd_by_id(prog_id: int) -> int:
    return _call(PROG_GET_FD_BY_ID, _attr("=III", prog_id, 0, 0))


@dataclass(frozen=True)
class ProgInfo:
    id: int
    type: int
    name: str
    tag: str


@dataclass(frozen=True)
class MapInfo:
    id: int
    type: int
    name: str
    key_size: int
    value_size: int
    max_entries: int
    flags: int


def _info(fd: int, size: int) -> ctypes.Array:
    info = ctypes.create_string_buffer(size)
    _call(OBJ_GET_INFO_BY_FD, _attr("=IIQ", fd, size, ctypes.addressof(info)))
    return info


def prog_info(fd: int) -> ProgInfo:
    info = _info(fd, 80)
    kind, prog_id = struct.unpack_from("=II", info, 0)
    tag = bytes(info[8:16]).hex()
    name = bytes(info[64:80]).split(b"\0", 1)[0].decode()
    return ProgInfo(id=prog_id, type=kind, name=name, tag=tag)


def map_info(fd: int) -> MapInfo:
    info = _info(fd, 40)
    kind, map_id, key_size, value_size, max_entries, flags = struct.unpack_from("=IIIIII", info, 0)
    name = bytes(info[24:40]).split(b"\0", 1)[0].decode()
    return MapInfo(id=map_id, type=kind, name=name, key_size=key_size, value_size=value_size,
                   max_entries=max_entries, flags=flags)


# ---- map elements -------------------------------------------------------------------------------

def map_lookup(fd: int, key: bytes, value_size: int) -> bytes | None:
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value_size)
    try:
        _call(MAP_LOOKUP_ELEM, _attr("=I4xQQQ", fd, _addr(k), _addr(v), 0))
    except BpfError as error:
        if error.errno == errno.ENOENT:
            return None
        raise
    return v.raw


def map_keys(fd: int, key_size: int) -> list[bytes]:
    """Every key of a map (MAP_GET_NEXT_KEY walk; no values copied)."""
    key = ctypes.create_string_buffer(key_size)
    nxt = ctypes.create_string_buffer(key_size)
    keys: list[bytes] = []
    while True:
        try:
            _call(MAP_GET_NEXT_KEY, _attr("=I4xQQ", fd, _addr(key) if keys else 0, _addr(nxt)))
        except BpfError as error:
            if error.errno == errno.ENOENT:
                return keys
            raise
        ctypes.memmove(key, nxt, key_size)
        keys.append(nxt.raw)


def map_count(fd: int, key_size: int, value_size: int, *, chunk: int = 8192) -> int:
    """How many entries: summed over MAP_LOOKUP_BATCH chunks (a few calls for 100k entries),
    else by a key walk (LPM trie); for status and for the metrics' scrapes."""
    try:
        return sum(got for got, _, _ in _batches(fd, key_size, value_size, chunk))
    except BpfError as error:
        if error.errno not in _NO_BATCH:
            raise
    return len(map_keys(fd, key_size))


def map_update(fd: int, key: bytes, value: bytes) -> None:
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value, len(value))
    _call(MAP_UPDATE_ELEM, _attr("=I4xQQQ", fd, _addr(k), _addr(v), 0))


def _batch_attr(*, fd: int, in_batch, out_batch, keys, values, count: int) -> ctypes.Array:
    return _attr("=QQQQII QQ", _addr(in_batch), _addr(out_batch), _addr(keys), _addr(values),
                 count, fd, 0, 0)


def map_read_all(fd: int, key_size: int, value_size: int, *, chunk: int = 8192) -> dict[bytes, bytes]:
    """Every entry, by MAP_LOOKUP_BATCH (hash, LRU, array maps), else one by one (LPM trie)."""
    try:
        return _read_batches(fd, key_size, value_size, chunk)
    except BpfError as error:
        if error.errno not in _NO_BATCH:
            raise
    found = {key: map_lookup(fd, key, value_size) for key in map_keys(fd, key_size)}
    return {key: value for key, value in found.items() if value is not None}


def _read_batches(fd: int, key_size: int, value_size: int, chunk: int) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for got, kraw, vraw in _batches(fd, key_size, value_size, chunk):
        for i in range(got):
            out[kraw[i * key_size:(i + 1) * key_size]] = vraw[i * value_size:(i + 1) * value_size]
    return out


def _batches(fd: int, key_size: int, value_size: int, chunk: int) -> Iterator[tuple[int, bytes, bytes]]:
    """MAP_LOOKUP_BATCH over the whole map: (entries got, their keys, their values) per call."""
    keys = ctypes.create_string_buffer(key_size * chunk)
    values = ctypes.create_string_buffer(value_size * chunk)
    token_in = ctypes.create_string_buffer(max(key_size, 8))
    token_out = ctypes.create_string_buffer(max(key_size, 8))
    first = True
    while True:
        attr = _batch_attr(fd=fd, in_batch=None if first else token_in, out_batch=token_out, keys=keys,
                           values=values, count=chunk)
        done = False
        try:
            _call(MAP_LOOKUP_BATCH, attr)
        except BpfError as error:
            if error.errno != errno.ENOENT:
                raise
            done = True
        got = struct.unpack_from("=I", attr, 32)[0]
        yield got, keys.raw[:got * key_size], values.raw[:got * value_size]
        if done:
            return
        ctypes.memmove(token_in, token_out, len(token_in))
        first = False


def map_update_batch(fd: int, items: list[tuple[bytes, bytes]]) -> None:
    if not items:
        return
    keys = ctypes.create_string_buffer(b"".join(k for k, _ in items))
    values = ctypes.create_string_buffer(b"".join(v for _, v in items))
    try:
        _call(MAP_UPDATE_BATCH, _batch_attr(fd=fd, in_batch=None, out_batch=None, keys=keys, values=values,
                                            count=len(items)))
    except BpfError as error:
        if error.errno not in _NO_BATCH:
            raise
        for key, value in items:
            map_update(fd, key, value)


def map_delete_batch(fd: int, keys: list[bytes]) -> None:
    """Delete `keys`; one that is already gone is not an error (deleting what is gone succeeds)."""
    if not keys:
        return
    buffer = ctypes.create_string_buffer(b"".join(keys))
    try:
        _call(MAP_DELETE_BATCH, _batch_attr(fd=fd, in_batch=None, out_batch=None, keys=buffer, values=None,
                                            count=len(keys)))
    except BpfError as error:
        if error.errno != errno.ENOENT and error.errno not in _NO_BATCH:
            raise
        for key in keys:   # the batch stops at the first missing key: finish one by one
            k = ctypes.create_string_buffer(key, len(key))
            try:
                _call(MAP_DELETE_ELEM, _attr("=I4xQ", fd, _addr(k)))
            except BpfError as single:
                if single.errno != errno.ENOENT:
                    raise


# ---- running a program on a packet --------------------------------------------------------------

def prog_test_run(prog_fd: int, data: bytes, *, out_size: int = 2048) -> tuple[int, bytes]:
    """Run `prog_fd` once on `data` (BPF_PROG_TEST_RUN): its return code and the packet it left."""
    data_in = ctypes.create_string_buffer(data, len(data))
    data_out = ctypes.create_string_buffer(out_size)
    attr = _attr("=IIIIQQII", prog_fd, 0, len(data), out_size, _addr(data_in), _addr(data_out), 1, 0)
    _call(PROG_TEST_RUN, attr)
    retval, _, size_out = struct.unpack_from("=III", attr, 4)
    return retval, data_out.raw[:size_out]
