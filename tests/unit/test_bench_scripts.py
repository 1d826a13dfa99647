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


@pytest.mark.parametrize("topology", ["mesh", "reflectors"])
def test_bgp_bench_fleet_configs_parse_in_bird(topology, tmp_path):
    """bench/bgp.py's BIRD-only fleets run the product's rendered configs: every node's parses."""
    from bench.bgp import Fleet
    fleet = Fleet(members=4, samples=1, topology=topology, bfd=True)
    for index in fleet.indexes:
        path = tmp_path / f"n{index}.conf"
        path.write_text(fleet.render(index))
        done = subprocess.run(["bird", "-p", "-c", str(path)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
