"""agents.allocator: a training process keeps freed blocks for the next step (counted in page faults, not time)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: a step's pattern: four 4 MB blocks allocated, written and freed, 30 times; prints the page faults per step
STEPS = """
import resource, sys
import numpy as np
if sys.argv[1] == "set":
    from agents.allocator import retain_freed_memory
    assert retain_freed_memory() and retain_freed_memory()
def step():
    blocks = [np.ones(1 << 20, np.float32) for _ in range(4)]
    del blocks
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(30):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 30)
"""


def _faults_per_step(mode: str) -> float:
    proc = subprocess.run([sys.executable, "-c", STEPS, mode], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return float(proc.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    default, kept = _faults_per_step("default"), _faults_per_step("set")
    assert default > 1000  # glibc's defaults: the 16 MB go back to the system and fault in again every step
    assert kept < 50, (default, kept)
