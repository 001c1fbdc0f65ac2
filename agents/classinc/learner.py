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
(those ``F_t`` was taken at). ``F_t`` comes from the batch's first update's own forward and backward
(:func:`interference.grad_moments`: the summed gradient and the summed squared per-sample gradients, layer by layer,
never materialised for Linear layers); the penalty's gradient ``lambda F (theta - theta*)`` is added to it directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from agents.allocator import retain_freed_memory
from interference import activation_spec, cross_entropy, grad_moments, mlp
from interference.activation_spec import activation_names

from .data import DATASETS, Dataset, seen_mask, stream_indices, task_classes

__all__ = ["ClassIncConfig", "MODELS", "build_model", "StreamingEWC", "optimizer", "update", "nll", "accuracy", "Progress", "train_class_inc"]

#: the model families: an MLP, or one convolution + ReLU + 2x2 max-pool before it
MODELS = ("mlp", "cnn")


def _s(default: Any, help: str, **metadata: Any) -> Any:
    """A setting: its default, help line and further metadata (:class:`agents.algorithm.Algorithm`'s flags)."""
    return field(default=default, metadata={"help": help, **metadata})


@dataclass
class ClassIncConfig:
    """One class-incremental run (per seed). ``None`` defaults follow the activation's conventions."""

    data: str = _s("split-digits", "split-digits (scikit-learn's bundled 8x8 digits), split-mnist / split-fashion "
                   "(IDX files), split-cifar10 (python pickle batches), embed (.npz or folder of .npy: x_train, "
                   "y_train, x_test, y_test)", choices=DATASETS)
    data_root: str | None = _s(None, "where the dataset's files are (split-fashion defaults to Debian's "
                               "/usr/share/datasets/fashion-mnist; embed: the .npz file or folder)")
    model: str = _s("mlp", "mlp, or cnn (conv 3x3 + ReLU + 2x2 max-pool first)", choices=MODELS)
    act: str = _s("relu", "the feature layer's activation (elephant gives EMLP/ECNN)", choices=activation_names)
    width: int = _s(1000, "feature units (the paper: 1000 and 10000)")
    layer_norm: bool | None = _s(None, "LayerNorm before the activation (unset: the activation's convention: "
                                 "Elephant yes, as the authors' EMLP; ReLU no)")
    sigma_bias: float | None = _s(None, "spread of the feature layer's biases (unset: the activation's convention: "
                                  "Elephant 0.4, others zero biases)")
    d: float = _s(4.0, "Elephant d")
    a: float = _s(0.08, "Elephant a (the paper sweeps 0.02 .. 0.32)")
    h: float = _s(1.0, "Elephant h")
    conv_channels: int = _s(64, "cnn: convolution channels", applies=lambda c: c.model == "cnn",
                            applies_text="--model cnn")
    lr: float = _s(1e-4, "RMSprop learning rate (decay 0.999)")
    batch_size: int = _s(125, "mini-batch size")
    updates: int = _s(1, "E: optimisation steps per mini-batch")
    ewc_lambda: float = _s(0.0, "Streaming EWC strength (0: off)")
    ewc_gamma: float = _s(0.99, "Streaming EWC decay", applies=lambda c: c.ewc_lambda > 0,
                          applies_text="--ewc-lambda > 0")
    classes_per_task: int = _s(2, "classes per task")
    class_order: str = _s("fixed", "fixed: (0,1), (2,3), ...; random: a permutation drawn by the seed",
                          choices=("fixed", "random"))
    eval_every: int = _s(10, "evaluate every N mini-batches (and at every task's end)")
    eval_samples: int = _s(0, "evaluate on a fixed random subset of this many test samples (0: all)")
    seeds: tuple[int, ...] = _s((0,), "seeds, one run log each (e.g. 0-4 or 0,2)")
    act_kwargs: dict[str, object] = field(default_factory=dict)  # the activation's other arguments, where set


def _act_kwargs(cfg: ClassIncConfig) -> dict[str, object]:
    """The activation's arguments: ``d``, ``a`` and ``h`` where its spec has arguments of those names, and
    ``act_kwargs``."""
    spec = activation_spec(cfg.act)
    return {**{k: float(getattr(cfg, k)) for k in ("d", "a", "h") if k in spec.arguments}, **cfg.act_kwargs}


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


#: per-sample cross-entropy ``-log p(y_n | x_n)`` ``(n,)`` of ``(x, y)``; the engine proves it per-sample with these
#: models, so Streaming EWC's squared gradients need no every-row check
nll = cross_entropy


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
    """Streaming EWC's state and gradient for one model (see the module docstring).

    ``fisher`` and ``anchor`` hold one tensor per trainable parameter (by name); ``fisher`` starts at zero.
    """

    def __init__(self, model: nn.Module, lam: float, gamma: float) -> None:
        self.lam, self.gamma = float(lam), float(gamma)
        self.params = {k: p for k, p in model.named_parameters() if p.requires_grad}
        self.fisher = {k: torch.zeros_like(p) for k, p in self.params.items()}
        self.anchor = {k: p.detach().clone() for k, p in self.params.items()}
        self._pending: tuple[dict[str, Tensor], dict[str, Tensor]] | None = None  # sum_n g_n^2, theta: at the first
        self._n = 1  # update's batch (of n samples)

    def backward(self, model: nn.Module, batch: tuple[Tensor, Tensor], first: bool) -> Tensor:
        """Put one update's gradient in the parameters' ``.grad`` (which must be ``None``): the mean cross-entropy's
        plus the penalty's ``lambda F (theta - theta*)``. ``first`` (the batch's first update) also takes ``F_t``
        and ``theta`` there, from the same forward and backward (:func:`interference.grad_moments`). Returns the
        mean cross-entropy (0-d, no graph)."""
        if first:
            n = self._n = len(batch[1])
            moments = grad_moments(model, nll, batch, params=list(self.params))
            for k, p in self.params.items():
                p.grad = moments.grad[k].div_(n)
            self._pending = (moments.squares, {k: p.detach().clone() for k, p in self.params.items()})
            loss = moments.loss.mean()
        else:
            loss = nll(model, batch).mean()
            loss.backward()
        grads, fisher = [p.grad for p in self.params.values()], list(self.fisher.values())
        with torch.no_grad():
            torch._foreach_addcmul_(grads, fisher, list(self.params.values()), value=self.lam)
            torch._foreach_addcmul_(grads, fisher, list(self.anchor.values()), value=-self.lam)
        return loss.detach()

    def after_updates(self) -> None:
        """``F <- gamma F + F_t``; the anchor becomes the parameters before the batch's updates."""
        if self._pending is None:
            raise RuntimeError("StreamingEWC.after_updates without a first backward")
        squares, before = self._pending
        fisher = list(self.fisher.values())
        torch._foreach_mul_(fisher, self.gamma)
        torch._foreach_add_(fisher, [squares[k] for k in self.fisher], alpha=1 / self._n)
        self.anchor, self._pending = before, None


def optimizer(model: nn.Module, cfg: ClassIncConfig) -> torch.optim.Optimizer:
    """The authors' optimiser: RMSprop with ``cfg.lr``, squared-gradient decay 0.999 and eps 1e-8."""
    return torch.optim.RMSprop(model.parameters(), lr=cfg.lr, alpha=0.999, eps=1e-8)


def update(model: nn.Module, opt: torch.optim.Optimizer, ewc: StreamingEWC | None, batch: tuple[Tensor, Tensor],
           updates: int) -> float:
    """The ``updates`` optimisation steps on one mini-batch (with Streaming EWC if ``ewc``); the mean cross-entropy
    at the first."""
    first = float("nan")
    for e in range(updates):
        opt.zero_grad(set_to_none=True)
        if ewc is not None:
            loss = ewc.backward(model, batch, first=e == 0)
        else:
            loss = nll(model, batch).mean()
            loss.backward()
        first = float(loss.detach()) if e == 0 else first
        opt.step()
    if ewc is not None:
        ewc.after_updates()
    return first


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
    opt = optimizer(model, cfg)
    ewc = StreamingEWC(model, cfg.ewc_lambda, cfg.ewc_gamma) if cfg.ewc_lambda > 0 else None
    samples = 0
    for b, (task, idx) in enumerate(batches, 1):
        batch = (_tensor(data.x_train, idx, device), _tensor(data.y_train, idx, device))
        first = update(model, opt, ewc, batch, cfg.updates)
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
