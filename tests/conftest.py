"""Shared test set-up: one torch thread (small ops are much slower with 2 threads on busy 2-core machines), SB3's
default loggers (models built directly by tests) writing their folders under pytest's temp directory, and the NTK
engine's small-model shortcut off (tests' models are tiny; they test the layer-wise paths' proofs, and
``tests/test_ntk.py`` tests the shortcut itself). It also marks the fast tier: every test that
``tests/slow_tests.txt`` does not list is marked ``unit`` (``pytest -m unit``, under 2 minutes on 2 cores)."""

import warnings
from pathlib import Path

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
def row_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the blocks the engine checks row by row in this test (blocks its structural proof covers are
    left out: :mod:`interference.structure`)."""
    from interference.rows import RowCheck

    checked: list[int] = []
    real = RowCheck.block

    def block(self, fn, batch, out, *args):
        if not self.proven:
            checked.append(out.shape[0])
        return real(self, fn, batch, out, *args)

    monkeypatch.setattr(RowCheck, "block", block)
    return checked


@pytest.fixture
def full_disk_at_results(monkeypatch: pytest.MonkeyPatch):
    """``torch.save`` of a population member's ``q_net.pt`` fails with ENOSPC (its checkpoint, written before, stays:
    a population stopped there resumes); call the returned function to free the space."""
    save = torch.save

    def no_space(obj, f, *args, **kwargs):
        if "q_net.pt" in str(getattr(f, "name", f)):  # (written into a temporary file beside it)
            raise OSError(28, "No space left on device")
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", no_space)
    return lambda: monkeypatch.setattr(torch, "save", save)


SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")
DESELECTED = ("sweep", "compile", "long")  # the tiers the default run leaves out: none of their tests is unit


def _slow_tests() -> dict[Path, set[str | None]]:
    """``{module path: {test or fixture name, or None for the whole module}}`` of ``tests/slow_tests.txt``."""
    slow: dict[Path, set[str | None]] = {}
    for line in SLOW_TESTS.read_text().splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            path, _, name = entry.partition("::")
            slow.setdefault((SLOW_TESTS.parent.parent / path).resolve(), set()).add(name or None)
    return slow


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks ``unit`` every test that is not deselected by default and not in ``tests/slow_tests.txt`` (not its
    module, its name, or a fixture of its module that it uses), so that a new test is in the fast tier by default."""
    slow = _slow_tests()
    modules = {}
    for item in items:
        path = item.path.resolve()
        names = slow.get(path)
        if names is not None:
            modules[path] = getattr(item, "module", None)
            if None in names or getattr(item, "originalname", item.name) in names \
                    or names.intersection(getattr(item, "fixturenames", ())):
                continue
        if not any(item.get_closest_marker(m) for m in DESELECTED):
            item.add_marker(pytest.mark.unit)
    for path, module in modules.items():  # entries that name nothing of their module (renamed or removed tests)
        stale = sorted(n for n in slow[path] if n is not None and module is not None and not hasattr(module, n))
        if stale:
            warnings.warn(pytest.PytestWarning(f"{SLOW_TESTS.name}: {path.name} has no {', '.join(stale)}"))
