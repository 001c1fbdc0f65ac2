"""Class-incremental streaming classification (the paper's appendix "Class Incremental Learning").

The rules: each training sample is used in exactly one mini-batch (``E`` optimisation steps on it, then never again),
the learner is told no task boundary, uses no pre-training and keeps no buffer of old samples or gradients. The
stream is the tasks' training samples in task order (each task's samples shuffled by the seed), each task's part cut
into mini-batches of ``batch_size``; a task's last mini-batch may be smaller, so that no mini-batch mixes two tasks
and the evaluation at a task's end sees the model after exactly that task's samples. Nothing in the learner reads
the batch size or the task.

Models (the authors' shapes): ``mlp`` is ``Flatten -> Linear(in, width) [-> LayerNorm] -> act -> Linear(width,
classes, no bias)``; ``cnn`` puts ``Conv2d(C, 64, 3x3, same padding) -> ReLU -> MaxPool 2x2`` before that MLP. With
``act=elephant`` they are EMLP and ECNN. LayerNorm before the activation and the spread of the hidden biases follow
the activation's convention (Elephant: LayerNorm, as the authors' EMLP; ReLU: neither) unless set.

Streaming EWC (:class:`StreamingEWC`): Online EWC with every mini-batch as a task. Before mini-batch ``t``'s updates
the diagonal empirical Fisher of the batch, ``F_t = mean_n (d log p(y_n | x_n) / d theta)^2``, is taken at the current
parameters; every update minimises the mean cross-entropy plus ``lambda/2 sum F (theta - theta*)^2``; after the
batch's updates ``F <- gamma F + F_t`` and the anchor ``theta*`` becomes the parameters before this latest update
(those ``F_t`` was taken at). Squared per-sample gradients are summed layer by layer
(:func:`interference.squared_grad_sum`), never materialised for Linear layers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from agents.allocator import retain_freed_memory
from interference import activation_spec, mlp, squared_grad_sum

from .data import Dataset, seen_mask, stream_indices, task_classes

__all__ = ["ClassIncConfig", "MODELS", "build_model", "StreamingEWC", "nll", "accuracy", "Progress", "train_class_inc"]

#: the model families: an MLP, or one convolution + ReLU + 2x2 max-pool before it
MODELS = ("mlp", "cnn")


@dataclass
class ClassIncConfig:
    """One class-incremental run (per seed). ``None`` defaults follow the activation's conventions."""

    data: str = "split-digits"
    data_root: str | None = None
    model: str = "mlp"
    act: str = "relu"
    width: int = 1000
    layer_norm: bool | None = None
    sigma_bias: float | None = None
    d: float = 4.0
    a: float = 0.08
    h: float = 1.0
    conv_channels: int = 64
    lr: float = 1e-4
    batch_size: int = 125
    updates: int = 1
    ewc_lambda: float = 0.0
    ewc_gamma: float = 0.99
    classes_per_task: int = 2
    class_order: str = "fixed"
    eval_every: int = 10
    eval_samples: int = 0
    seeds: tuple[int, ...] = field(default=(0,))


def _act_kwargs(cfg: ClassIncConfig) -> dict[str, float]:
    spec = activation_spec(cfg.act)
    return {k: float(getattr(cfg, k)) for k in ("d", "a", "h") if k in spec.arguments}


def build_model(cfg: ClassIncConfig, input_shape: Sequence[int], n_classes: int, seed: int) -> nn.Sequential:
    """The run's network for ``seed``: ``(N, *input_shape) -> (N, n_classes)`` logits."""
    torch.manual_seed(seed)
    if cfg.model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {cfg.model!r}")
    layers: list[nn.Module] = []
    if cfg.model == "cnn":
        if len(input_shape) != 3:
            raise ValueError(f"model cnn needs image inputs (C, H, W), got samples of shape {tuple(input_shape)}; "
                             "use --model mlp")
        c, hgt, wid = input_shape
        layers += [nn.Conv2d(c, cfg.conv_channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        features = cfg.conv_channels * (hgt // 2) * (wid // 2)
    else:
        features = int(np.prod(input_shape))
    head = mlp(features, [cfg.width], n_classes, cfg.act, _act_kwargs(cfg), layer_norm=cfg.layer_norm,
               sigma_bias=cfg.sigma_bias, output_bias=False)
    return nn.Sequential(*layers, nn.Flatten(), *head)


def nll(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """Per-sample cross-entropy ``-log p(y_n | x_n)`` ``(n,)``."""
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def accuracy(model: nn.Module, x: Tensor, y: Tensor, chunk: int = 2000) -> float:
    """Fraction of ``x`` (N, ...) classified as ``y`` (N,); NaN for no samples."""
    if len(y) == 0:
        return float("nan")
    right = 0
    with torch.no_grad():
        for i in range(0, len(y), chunk):
            right += int((model(x[i:i + chunk]).argmax(1) == y[i:i + chunk]).sum())
    return right / len(y)


class StreamingEWC:
    """Streaming EWC's state and penalty for one model (see the module docstring).

    ``fisher`` and ``anchor`` hold one tensor per trainable parameter (by name); ``fisher`` starts at zero.
    """

    def __init__(self, model: nn.Module, lam: float, gamma: float) -> None:
        self.lam, self.gamma = float(lam), float(gamma)
        self.params = {k: p for k, p in model.named_parameters() if p.requires_grad}
        self.fisher = {k: torch.zeros_like(p) for k, p in self.params.items()}
        self.anchor = {k: p.detach().clone() for k, p in self.params.items()}
        self._pending: tuple[dict[str, Tensor], dict[str, Tensor]] | None = None

    def penalty(self) -> Tensor:
        """``lambda/2 sum F (theta - theta*)^2`` (a scalar with gradient)."""
        return 0.5 * self.lam * sum(((p - self.anchor[k]).pow(2) * self.fisher[k]).sum()
                                    for k, p in self.params.items())

    def before_updates(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> None:
        """Take ``F_t`` (the batch's mean squared per-sample gradient) and ``theta`` now, before the batch's updates."""
        n = len(batch[1])
        sums = squared_grad_sum(model, nll, batch, params=list(self.params))
        self._pending = ({k: s / n for k, s in sums.items()},
                         {k: p.detach().clone() for k, p in self.params.items()})

    def after_updates(self) -> None:
        """``F <- gamma F + F_t``; the anchor becomes the parameters before the batch's updates."""
        if self._pending is None:
            raise RuntimeError("StreamingEWC.after_updates without before_updates")
        fisher_t, before = self._pending
        for k in self.fisher:
            self.fisher[k].mul_(self.gamma).add_(fisher_t[k])
        self.anchor, self._pending = before, None


@dataclass
class Progress:
    """What the learner reports after a mini-batch (``on_batch``): ``batch`` (1-based count), ``samples`` seen,
    ``task`` (index of the batch's task; the learner itself never reads it), ``task_end`` (the batch holds the
    task's last samples), ``indices`` (the training samples of this batch), ``steps`` (updates
    made on it), ``loss`` (mean cross-entropy at its first update)."""

    batch: int
    samples: int
    task: int
    task_end: bool
    indices: np.ndarray
    steps: int
    loss: float


def _tensor(x: np.ndarray, idx: np.ndarray | slice, device: str) -> Tensor:
    return torch.as_tensor(x[idx], device=device)


def train_class_inc(cfg: ClassIncConfig, data: Dataset, seed: int, on_batch: Callable[[Progress, nn.Module], None],
                    device: str = "cpu") -> nn.Module:
    """Train one seed's model on the class-incremental stream; ``on_batch(progress, model)`` after every mini-batch.

    Returns the trained model. Everything random (class order, stream order, initial weights) follows ``seed``.
    Sets the process's allocator for training (:func:`agents.allocator.retain_freed_memory`).
    """
    retain_freed_memory()
    tasks = task_classes(data.n_classes, cfg.classes_per_task, order=cfg.class_order, seed=seed)
    per_task = stream_indices(data.y_train, tasks, seed)
    batches = [(k, ix[i:i + cfg.batch_size]) for k, ix in enumerate(per_task) for i in range(0, len(ix), cfg.batch_size)]
    model = build_model(cfg, data.input_shape, data.n_classes, seed).to(device)
    opt = torch.optim.RMSprop(model.parameters(), lr=cfg.lr, alpha=0.999, eps=1e-8)
    ewc = StreamingEWC(model, cfg.ewc_lambda, cfg.ewc_gamma) if cfg.ewc_lambda > 0 else None
    samples = 0
    for b, (task, idx) in enumerate(batches, 1):
        batch = (_tensor(data.x_train, idx, device), _tensor(data.y_train, idx, device))
        if ewc is not None:
            ewc.before_updates(model, batch)
        first = float("nan")
        for e in range(cfg.updates):
            opt.zero_grad(set_to_none=True)
            loss = nll(model, batch).mean()
            first = float(loss.detach()) if e == 0 else first
            (loss + ewc.penalty() if ewc is not None else loss).backward()
            opt.step()
        if ewc is not None:
            ewc.after_updates()
        samples += len(idx)
        task_end = b == len(batches) or batches[b][0] != task
        on_batch(Progress(b, samples, task, task_end, idx, cfg.updates, first), model)
    return model


def seen_accuracy(model: nn.Module, data: Dataset, tasks: Sequence[Sequence[int]], k: int,
                  subset: np.ndarray | None = None, device: str = "cpu") -> float:
    """Test accuracy over the classes of ``tasks[0..k]`` (optionally among the test samples ``subset`` only)."""
    mask = seen_mask(data.y_test, tasks, k)
    if subset is not None:
        keep = np.zeros_like(mask)
        keep[subset] = True
        mask &= keep
    idx = np.flatnonzero(mask)
    return accuracy(model, _tensor(data.x_test, idx, device), _tensor(data.y_test, idx, device))


def task_accuracies(model: nn.Module, data: Dataset, tasks: Sequence[Sequence[int]], device: str = "cpu") -> np.ndarray:
    """Test accuracy on each task's classes alone ``(n_tasks,)`` (classified among all classes)."""
    out = np.empty(len(tasks))
    for j, classes in enumerate(tasks):
        idx = np.flatnonzero(np.isin(data.y_test, classes))
        out[j] = accuracy(model, _tensor(data.x_test, idx, device), _tensor(data.y_test, idx, device))
    return out
