"""bcc in a process of its own: C text in, loaded programs' file descriptors out.

bcc compiles with LLVM, and LLVM stays mapped and resident in the process that imported
bcc (issue 31: the agent measured 227 MiB at 10,000 Services in eBPF mode, about half of it
bcc and LLVM). So the agent never imports bcc: `compile_and_load` runs `python -m
ebpf.compiler` once per load, hands it the source text and the programs wanted as JSON on its
stdin, and the child compiles (creating or opening the pinned maps the source declares),
loads each program through the verifier, sends the descriptors back over a unix socket
(SCM_RIGHTS) and exits, taking LLVM with it. In the agent, the descriptors keep the programs
alive until they are attached (and each program keeps its maps); the pins keep the maps.

The child answers with one message: `{"programs": [names, in the descriptors' order]}` with
the descriptors, or `{"stage": "compile" | "load", "program": name, "error": text}` without.
Its stderr (bcc's compiler and verifier messages) is kept for the error. A child that dies,
hangs past `timeout` (killed) or answers with fewer descriptors than programs is an error
too: the caller gets every program or none (descriptors that did arrive are closed).
The child imports bcc and this module (with `netagent.errors`) only, never the agent's code.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from netagent.errors import NetagentError

PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)   # where `ebpf` is importable from
TIMEOUT = 600.0       # seconds for compile and load (about 10 s on a loaded 2-core machine)
MESSAGE_BYTES = 65536
MAX_PROGRAMS = 64     # one message carries them all (the kernel's limit, SCM_MAX_FD, is 253)
STDERR_TAIL = 4000    # characters of the child's stderr kept in an error


@dataclass(frozen=True)
class ProgramSpec:
    """A program of the source to load: its function name, bpf_prog_type and, for the programs
    that need one at load time (cgroup sock_addr), its expected attach type."""

    name: str
    prog_type: int
    attach_type: int | None = None


class CompileError(NetagentError):
    """bcc could not compile the source (`stage` "compile") or the kernel refused a program
    (`stage` "load", `program` named); `detail` is bcc's message, with its stderr's tail."""

    def __init__(self, stage: str, detail: str, *, program: str | None = None):
        super().__init__(f"{stage}{f' {program}' if program else ''}: {detail}")
        self.stage, self.detail, self.program = stage, detail, program


def compile_and_load(source: str, programs: Sequence[ProgramSpec], *, timeout: float = TIMEOUT) -> dict[str, int]:
    """Program name -> a descriptor of it loaded, each one the caller's to close."""
    if not 0 < len(programs) <= MAX_PROGRAMS or len({p.name for p in programs}) != len(programs):
        raise ValueError(f"1 to {MAX_PROGRAMS} programs of distinct names, not {[p.name for p in programs]}")
    request = json.dumps({"source": source,
                          "programs": [[p.name, p.prog_type, p.attach_type] for p in programs]})
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours:
        with theirs:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (PACKAGE_ROOT,
                                                                              os.environ.get("PYTHONPATH"))))}
            try:
                child = subprocess.run([sys.executable, "-m", "ebpf.compiler", str(theirs.fileno())],
                                       input=request, text=True, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, pass_fds=(theirs.fileno(),), env=env,
                                       timeout=timeout, check=False)
            except subprocess.TimeoutExpired:
                raise CompileError("compile", f"bcc's process did not finish in {timeout:.0f} s (killed)") from None
        ours.setblocking(False)   # the child has exited: its answer is queued, or there is none
        try:
            message, fds, flags, _ = socket.recv_fds(ours, MESSAGE_BYTES, MAX_PROGRAMS)
        except BlockingIOError:
            message, fds, flags = b"", [], 0
    return _answer(message, fds, flags, programs, child)


def _answer(message: bytes, fds: list[int], flags: int, programs: Sequence[ProgramSpec],
            child: subprocess.CompletedProcess[str]) -> dict[str, int]:
    """The descriptors by name, or CompileError (closing whatever arrived)."""
    tail = (child.stderr or "").strip()[-STDERR_TAIL:]
    try:
        reply = json.loads(message) if message else None
        if not isinstance(reply, dict):
            raise CompileError("compile", f"bcc's process exited with status {child.returncode} without an "
                                          f"answer{': ' + tail if tail else ''}")
        if "error" in reply:
            detail = str(reply["error"]) + (f"\n{tail}" if tail else "")
            raise CompileError(str(reply.get("stage", "compile")), detail, program=reply.get("program"))
        names = reply.get("programs")
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or names != [p.name for p in programs] \
                or len(fds) != len(programs):
            raise CompileError("load", f"bcc's process answered {len(fds)} descriptor(s) for {names!r}, "
                                       f"{len(programs)} programs asked")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return dict(zip(names, fds))


# ---- the child (python -m ebpf.compiler FD) ---------------------------------------------------------

def _child(answer: socket.socket) -> int:
    request = json.load(sys.stdin)

    def refuse(stage: str, error: object, program: str | None = None) -> int:
        text = json.dumps({"stage": stage, "program": program, "error": str(error)[:STDERR_TAIL]})
        answer.send(text.encode())
        return 1

    try:
        from bcc import BPF   # Debian's python3-bpfcc: LLVM, in this process only
    except ImportError as error:
        return refuse("compile", f"bcc is not importable ({error}): install python3-bpfcc")
    try:
        compiled = BPF(text=request["source"].encode())
    except Exception as error:   # bcc raises plain Exception
        return refuse("compile", error)
    fds, names = [], []
    for name, prog_type, attach_type in request["programs"]:
        extra = {} if attach_type is None else {"attach_type": attach_type}
        try:
            fds.append(compiled.load_func(name.encode(), prog_type, **extra).fd)
        except Exception as error:
            return refuse("load", error, name)
        names.append(name)
    socket.send_fds(answer, [json.dumps({"programs": names}).encode()], fds)
    return 0   # exiting closes our descriptors: the ones in flight are the agent's


if __name__ == "__main__":
    with socket.socket(fileno=int(sys.argv[1])) as channel:
        sys.exit(_child(channel))
