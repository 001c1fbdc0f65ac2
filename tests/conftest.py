"""Shared test set-up: one torch thread (small ops are much slower with 2 threads on busy 2-core machines), and
SB3's default loggers (models built directly by tests) writing their folders under pytest's temp directory."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _sb3_logdir(tmp_path_factory: pytest.TempPathFactory):
    patch = pytest.MonkeyPatch()
    patch.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3-logs")))
    yield
    patch.undo()
