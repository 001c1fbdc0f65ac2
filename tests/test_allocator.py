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


def _tiny_class_inc() -> None:
    import numpy as np

    from agents.classinc.data import Dataset
    from agents.classinc.learner import ClassIncConfig, train_class_inc
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 3)).astype(np.float32), np.arange(8) % 4
    train_class_inc(ClassIncConfig(width=4, batch_size=4), Dataset("embed", x, y, x, y, "toy"), 0, lambda p, m: None)


def _tiny_stream() -> None:
    from agents.stream.learner import StreamConfig, train_stream
    train_stream(StreamConfig(n=2, n_test=4, width=4, updates=1))


@pytest.mark.parametrize("module, train", [("agents.classinc.learner", _tiny_class_inc),
                                           ("agents.stream.learner", _tiny_stream)])
def test_learners_set_the_allocator_before_training(monkeypatch, module, train):
    # (the population engine and SB3 runs call it too; its effect is the page-fault test above)
    calls = []
    monkeypatch.setattr(f"{module}.retain_freed_memory", lambda: calls.append(1) or True)
    train()
    assert calls == [1]
