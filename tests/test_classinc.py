"""Class-incremental learner: Streaming EWC against a slow per-sample twin, the single-pass rule, the command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from agents.classinc.data import Dataset
from agents.classinc.learner import ClassIncConfig, Progress, StreamingEWC, build_model, train_class_inc
from runlog import read_run

ROOT = Path(__file__).resolve().parents[1]


def toy(n_train: int = 40, n_test: int = 20, classes: int = 4, dtype=np.float64, seed: int = 0) -> Dataset:
    """Gaussian blobs in 6-D, one per class."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, 6)) * 2

    def draw(n):
        y = np.arange(n) % classes
        return (centres[y] + rng.normal(size=(n, 6))).astype(dtype), y.astype(np.int64)

    (xtr, ytr), (xte, yte) = draw(n_train), draw(n_test)
    return Dataset("embed", xtr, ytr, xte, yte, "toy")


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def slow_ewc_run(cfg: ClassIncConfig, data: Dataset, seed: int) -> list[torch.Tensor]:
    """Streaming EWC written out: per-sample gradients one backward at a time, the Fisher recursion and the penalty
    with explicit loops, RMSprop by torch (the optimiser is not what is tested)."""
    from agents.classinc.data import stream_indices, task_classes
    tasks = task_classes(data.n_classes, cfg.classes_per_task, order=cfg.class_order, seed=seed)
    per_task = stream_indices(data.y_train, tasks, seed)
    model = build_model(cfg, data.input_shape, data.n_classes, seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.RMSprop(params, lr=cfg.lr, alpha=0.999, eps=1e-8)
    fisher = [torch.zeros_like(p) for p in params]
    anchor = [p.detach().clone() for p in params]
    for idx in [ix[i:i + cfg.batch_size] for ix in per_task for i in range(0, len(ix), cfg.batch_size)]:
        x, y = torch.as_tensor(data.x_train[idx]), torch.as_tensor(data.y_train[idx])
        fisher_t = [torch.zeros_like(p) for p in params]
        for i in range(len(idx)):
            loss_i = F.cross_entropy(model(x[i:i + 1]), y[i:i + 1])
            for f, g in zip(fisher_t, torch.autograd.grad(loss_i, params)):
                f += g.pow(2) / len(idx)
        before = [p.detach().clone() for p in params]
        for _ in range(cfg.updates):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            for p, f, a in zip(params, fisher, anchor):
                loss = loss + cfg.ewc_lambda / 2 * (f * (p - a) ** 2).sum()
            loss.backward()
            opt.step()
        fisher = [cfg.ewc_gamma * f + ft for f, ft in zip(fisher, fisher_t)]
        anchor = before
    return [p.detach() for p in params]


@pytest.mark.parametrize("act,updates", [("relu", 1), ("elephant", 2)])
def test_streaming_ewc_matches_slow_twin(float64, act: str, updates: int) -> None:
    data = toy()
    cfg = ClassIncConfig(data="embed", act=act, width=16, lr=3e-2, batch_size=7, updates=updates, ewc_lambda=50.0,
                         ewc_gamma=0.9)
    fast = train_class_inc(cfg, data, 3, lambda p, m: None)
    slow = slow_ewc_run(cfg, data, 3)
    plain = train_class_inc(ClassIncConfig(**{**cfg.__dict__, "ewc_lambda": 0.0}), data, 3, lambda p, m: None)
    for a, b in zip([p for p in fast.parameters() if p.requires_grad], slow):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)  # float64; RMSprop divides by small roots
    # the penalty acts even with E = 1: the anchor is the parameters before the latest update, not the current ones
    moved = max(float((a - b).detach().abs().max()) for a, b in zip(fast.parameters(), plain.parameters()))
    assert moved > 1e-4


def test_ewc_state_recursion(float64) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2, bias=False))
    ewc = StreamingEWC(model, lam=2.0, gamma=0.5)
    batch = (torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1]))

    def mean_sq_grads() -> list[torch.Tensor]:
        out = [torch.zeros_like(p) for p in model.parameters()]
        for i in range(5):
            loss = F.cross_entropy(model(batch[0][i:i + 1]), batch[1][i:i + 1])
            for o, g in zip(out, torch.autograd.grad(loss, list(model.parameters()))):
                o += g.pow(2) / 5
        return out

    def first_backward() -> None:
        model.zero_grad(set_to_none=True)
        ewc.backward(model, batch, first=True)

    with pytest.raises(RuntimeError, match="without a first backward"):
        ewc.after_updates()
    f1 = mean_sq_grads()
    first_backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)
    ewc.after_updates()
    f2 = mean_sq_grads()
    moved = [p.detach().clone() for p in model.parameters()]
    first_backward()
    ewc.after_updates()
    for (k, p), a, b, m in zip(model.named_parameters(), f1, f2, moved):
        torch.testing.assert_close(ewc.fisher[k], 0.5 * a + b)  # F = gamma F_1 + F_2
        torch.testing.assert_close(ewc.anchor[k], m)  # the parameters before the latest (empty) update
    # the gradient put in .grad: autograd's of the mean cross-entropy plus the penalty, away from the anchor
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(0.05)
    loss = F.cross_entropy(model(batch[0]), batch[1]) + ewc.lam / 2 * sum(
        (ewc.fisher[k] * (p - ewc.anchor[k]) ** 2).sum() for k, p in model.named_parameters())
    expected = torch.autograd.grad(loss, list(model.parameters()))
    for update in (True, False):  # a batch's first update, and a later one
        model.zero_grad(set_to_none=True)
        got = ewc.backward(model, batch, first=update)
        torch.testing.assert_close(got, F.cross_entropy(model(batch[0]), batch[1]).detach())
        for p, e in zip(model.parameters(), expected):
            torch.testing.assert_close(p.grad, e)


class CountingArray:
    """A training-input array that counts how often each sample is read."""

    def __init__(self, x: np.ndarray) -> None:
        self.x, self.reads = x, np.zeros(len(x), dtype=int)
        self.shape, self.dtype = x.shape, x.dtype

    def __getitem__(self, idx):
        np.add.at(self.reads, np.arange(len(self.x))[idx], 1)
        return self.x[idx]

    def __len__(self) -> int:
        return len(self.x)


@pytest.mark.parametrize("updates,lam", [(1, 0.0), (2, 10.0)])
def test_single_pass(monkeypatch: pytest.MonkeyPatch, updates: int, lam: float) -> None:
    """Every training sample of the tasks' classes is read for exactly one mini-batch, which gets exactly E updates;
    samples of classes in no task are never read."""
    base = toy(n_train=61, classes=5, dtype=np.float32)
    counting = CountingArray(base.x_train)
    data = Dataset("embed", counting, base.y_train, base.x_test, base.y_test, "toy")  # type: ignore[arg-type]
    steps = [0]
    real_step = torch.optim.RMSprop.step

    def counted(self, *a, **k):
        steps[0] += 1
        return real_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.RMSprop, "step", counted)
    seen: list[np.ndarray] = []
    per_batch: list[int] = []

    def on_batch(p: Progress, model) -> None:
        seen.append(p.indices)
        per_batch.append(steps[0])
        steps[0] = 0

    cfg = ClassIncConfig(data="embed", width=8, batch_size=6, updates=updates, ewc_lambda=lam, lr=1e-3)
    with pytest.raises(ValueError, match="must divide"):
        train_class_inc(cfg, data, 0, on_batch)  # 5 classes, 2 per task
    cfg.classes_per_task = 5
    counting.reads[:] = 0
    seen.clear(), per_batch.clear()
    train_class_inc(cfg, data, 0, on_batch)
    used = np.concatenate(seen)
    assert sorted(used.tolist()) == list(range(61))
    assert counting.reads.tolist() == [1] * 61
    assert per_batch == [updates] * len(seen)
    assert [len(s) for s in seen] == [6] * 10 + [1]


def _train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agents.train", "class-inc", *args], cwd=cwd, capture_output=True,
                          text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_command_split_digits(tmp_path: Path) -> None:
    r = _train("--out", str(tmp_path), "--act", "elephant", "--width", "32", "--lr", "1e-3", "--seeds", "0,1",
               cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert set(summary["final_acc"]) == {"0", "1"}
    runs = sorted(tmp_path.glob("class-inc/split-digits/mlp-elephant/w32-bs10/*/seed*/run.h5"))
    assert len(runs) == 2
    run = read_run(runs[0])
    assert run.config["tasks"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    ends, _ = run.scalars["task_acc_0"]
    assert len(ends) == 5 and ends[-1] == run.scalars["final_acc"][0][0]
    assert run.scalars["final_acc"][1][0] == pytest.approx(summary["final_acc"]["0"], rel=1e-5)  # stdout rounds to 6 digits
    assert set(run.probes) >= {"gradcov", "sparsity"}
    assert list(run.probes["gradcov"]["step"]) == list(ends)


@pytest.mark.parametrize("args,message", [
    (["--data", "split-mnist"], "--data-root"),
    (["--act", "nope"], "invalid choice"),
    (["--lr", "-1"], "lr must be a positive"),
    (["--ewc-gamma", "2"], "ewc_gamma"),
    (["--probe", "nope"], "unknown probe"),
    (["--data", "embed", "--data-root", "/nonexistent.npz"], "nonexistent"),
    (["--act", "relu", "--a", "0.1"], "would be ignored"),
    (["--ewc-lambda", "10", "--ewc-gamma", "1.5"], "ewc_gamma must be"),
    (["--conv-channels", "8"], "conv_channels would be ignored here (conv_channels is for --model cnn)"),
    (["--ewc-gamma", "0.5"], "ewc_gamma would be ignored here (ewc_gamma is for --ewc-lambda > 0)"),
])
def test_command_errors(tmp_path: Path, args: list[str], message: str) -> None:
    r = _train("--out", str(tmp_path), *args, cwd=tmp_path)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("name", ["class_inc_digits.yml", "class_inc_fashion.yml"])
def test_shipped_grids_validate(tmp_path: Path, name: str) -> None:
    """Every entry of the shipped sweeps passes the command's checks and gets a run folder of its own."""
    from agents.grid import load_grid, plan
    runs = plan(load_grid(ROOT / "agents" / "grids" / name), tmp_path)
    assert len({str(r.run_dir) for r in runs}) == len(runs) > 0


def test_diverged_run_is_a_failure(tmp_path: Path) -> None:
    r = _train("--out", str(tmp_path), "--width", "16", "--lr", "1e30", "--probe", "", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "diverged" in r.stderr and json.loads(r.stdout)["status"] == "nan"
    (path,) = tmp_path.glob("class-inc/split-digits/mlp-relu/*/*/seed0/run.h5")
    steps, values = read_run(path).scalars["run_end"]
    assert values[0] == 2 and steps[0] > 0  # RUN_END.index("nan"), at the step it diverged
