"""Shared test set-up: one torch thread (small ops are much slower with 2 threads on busy 2-core machines), SB3's
default loggers (models built directly by tests) writing their folders under pytest's temp directory, and the NTK
engine's small-model shortcut off (tests' models are tiny; they test the layer-wise paths' proofs, and
``tests/test_ntk.py`` tests the shortcut itself)."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _no_small_model_shortcut(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("interference.plan.SMALL_JACOBIAN", 0)


@pytest.fixture(autouse=True, scope="session")
def _sb3_logdir(tmp_path_factory: pytest.TempPathFactory):
    patch = pytest.MonkeyPatch()
    patch.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3-logs")))
    yield
    patch.undo()


@pytest.fixture
def full_disk_at_results(monkeypatch: pytest.MonkeyPatch):
    """``torch.save`` of a population member's ``q_net.pt`` fails with ENOSPC (its checkpoint, written before, stays:
    a population stopped there resumes); call the returned function to free the space."""
    save = torch.save

    def no_space(obj, f, *args, **kwargs):
        if str(f).endswith("q_net.pt"):
            raise OSError(28, "No space left on device")
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", no_space)
    return lambda: monkeypatch.setattr(torch, "save", save)
