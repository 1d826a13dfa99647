"""ebpf/compiler.py without root: the real child process and the real SCM_RIGHTS hand-over,
with a stand-in `bcc` on the child's path (its "programs" are descriptors of files the test
can recognise), and the parent's reading of every kind of answer."""
from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from ebpf.compiler import CompileError, ProgramSpec, _answer, compile_and_load

STAND_IN_BCC = '''
import os, sys
class _Fn:
    def __init__(self, fd): self.fd = fd
class BPF:
    def __init__(self, text):
        if b"does not compile" in text:
            print("error: use of undeclared identifier 'nonsense'", file=sys.stderr)
            raise Exception("Failed to compile BPF module <text>")
        self.text = text.decode()
        self.marks = os.environ["STAND_IN_MARKS"]
    def load_func(self, name, prog_type, attach_type=-1):
        if name.decode() not in self.text:
            raise Exception(f"Failed to load BPF program {name!r}: Invalid argument")
        path = os.path.join(self.marks, f"{name.decode()}-{prog_type}-{attach_type}")
        open(path, "w").close()
        return _Fn(os.open(path, os.O_RDONLY))
'''


@pytest.fixture
def stand_in_bcc(tmp_path, monkeypatch):
    """A `bcc` the child imports first; the directory where its programs' files are made."""
    package = tmp_path / "path" / "bcc"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(STAND_IN_BCC))
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "path"))
    monkeypatch.setenv("STAND_IN_MARKS", str(marks))
    return marks


def target(fd: int) -> str:
    return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))


def test_descriptors_cross_the_process_boundary_by_name(stand_in_bcc):
    fds = compile_and_load("int na_a; int na_b;", [ProgramSpec("na_a", 18, 10), ProgramSpec("na_b", 3)])
    try:
        assert {name: target(fd) for name, fd in fds.items()} == {"na_a": "na_a-18-10", "na_b": "na_b-3--1"}
    finally:
        for fd in fds.values():
            os.close(fd)


def test_a_compile_failure_carries_the_compilers_message(stand_in_bcc):
    with pytest.raises(CompileError) as caught:
        compile_and_load("this does not compile", [ProgramSpec("na_a", 3)])
    assert caught.value.stage == "compile" and caught.value.program is None
    assert "Failed to compile" in caught.value.detail and "undeclared identifier 'nonsense'" in caught.value.detail


def test_a_refused_program_is_named_and_no_descriptor_is_left_open(stand_in_bcc):
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(CompileError, match="^load na_missing: Failed to load") as caught:
        compile_and_load("int na_a;", [ProgramSpec("na_a", 3), ProgramSpec("na_missing", 3)])
    assert caught.value.program == "na_missing"
    assert set(os.listdir("/proc/self/fd")) <= before


def test_a_compiler_that_hangs_is_killed(stand_in_bcc, monkeypatch):
    (stand_in_bcc.parent / "path" / "bcc" / "__init__.py").write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(CompileError, match="did not finish in 1 s"):
        compile_and_load("int na_a;", [ProgramSpec("na_a", 3)], timeout=1)


def done(returncode: int, stderr: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(args=[], returncode=returncode, stdout="", stderr=stderr)


def test_a_child_that_died_without_an_answer_is_an_error_with_its_stderr():
    with pytest.raises(CompileError, match=r"status -9 without an answer: Killed"):
        _answer(b"", [], 0, [ProgramSpec("na_a", 3)], done(-9, "Killed\n"))


def test_fewer_descriptors_than_programs_is_an_error_and_those_that_came_are_closed():
    read, write = os.pipe()
    os.close(write)
    with pytest.raises(CompileError, match="1 descriptor"):
        _answer(b'{"programs": ["na_a", "na_b"]}', [read], 0, [ProgramSpec("na_a", 3), ProgramSpec("na_b", 3)],
                done(0))
    with pytest.raises(OSError):
        os.fstat(read)


@pytest.mark.parametrize("names", [[], ["na_a", "na_a"]])
def test_the_programs_asked_are_some_and_distinct(names):
    with pytest.raises(ValueError):
        compile_and_load("", [ProgramSpec(name, 3) for name in names])
