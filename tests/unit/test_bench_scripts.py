"""Every benchmark script still starts: a moved module must not silently break `bench/`.

The benchmarks need root and minutes, so the suite does not run them; `--help` imports
everything a script imports and parses its arguments, which is where a refactor breaks them.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_bench_script_starts(script):
    done = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
