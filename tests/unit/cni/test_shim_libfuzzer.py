"""The shim's coverage-guided fuzzer (cni/shim/fuzz/), built with ASan and UBSan, run for a short budget.

cni/shim/fuzz/run.sh builds the libFuzzer harness (the shim's own parsing and framing
functions, included with its main renamed) and fuzzes from a copy of the committed seeds for
FUZZ_SECONDS; any crash, sanitizer report or broken harness invariant makes it exit non-zero
and leaves the input as crash-*. First every committed seed (past crashes included) is replayed
once, deterministically. Skipped only when clang is absent (scripts/setup.sh installs clang and
libclang-rt-dev); run it by hand for longer: `cni/shim/fuzz/run.sh 600`.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from netagent.cniserver import install as cni_install

FUZZ_DIR = os.path.join(cni_install.shim_source_dir(), "fuzz")
FUZZ_SECONDS = 25


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> str:
    if not shutil.which(os.environ.get("FUZZ_CC", "clang")):
        pytest.skip("no clang to build the shim's libFuzzer harness: apt-get install clang libclang-rt-dev")
    return str(tmp_path_factory.mktemp("shim-fuzz"))


def seeds() -> list[str]:
    directory = os.path.join(FUZZ_DIR, "corpus")
    return sorted(os.path.join(directory, name) for name in os.listdir(directory))


def test_the_seed_corpus_is_small_and_replays_cleanly(workdir):
    assert 5 <= len(seeds()) <= 100 and all(os.path.getsize(s) <= 4096 for s in seeds())
    harness = os.path.join(workdir, "replay")
    build = subprocess.run(["sh", os.path.join(FUZZ_DIR, "build.sh"), harness], capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stderr
    proc = subprocess.run([harness, *seeds()], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.count("Executed ") == len(seeds())


def test_a_short_fuzzing_run_finds_no_crash(workdir):
    proc = subprocess.run(["sh", os.path.join(FUZZ_DIR, "run.sh"), str(FUZZ_SECONDS), workdir],
                          capture_output=True, text=True, timeout=FUZZ_SECONDS + 600)
    found = sorted(n for n in os.listdir(workdir) if n.startswith(("crash-", "leak-", "timeout-", "oom-")))
    assert proc.returncode == 0 and not found, f"{found}\n{proc.stderr[-6000:]}"
    executions = int(re.search(r"stat::number_of_executed_units: (\d+)", proc.stderr).group(1))
    cov, ft = map(int, re.findall(r"DONE +cov: (\d+) ft: (\d+)", proc.stderr)[-1])
    print(f"\nshim fuzzer, {FUZZ_SECONDS} s: {executions} executions, cov {cov}, ft {ft}, crashes 0")
    assert executions > len(seeds()) and cov > 0  # it mutated past the seeds, with coverage feedback
