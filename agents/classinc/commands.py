"""``python -m agents.train class-inc``: class-incremental streaming classification, several seeds per run folder
(an :class:`agents.algorithm.Algorithm` declaration; defaults per dataset from ``agents/hyperparams/class_inc.yml``).

Run folders: ``OUT/class-inc/<data>/<model>-<act>[-ewc]/w<width>-bs<batch>/<lr, E, activation and EWC settings>/
seed<k>/run.h5``. Each seed's run log holds the scalars ``test_acc`` (test accuracy over the classes seen so far,
every ``eval_every`` mini-batches and at each task's end; step = training samples seen), ``train_loss`` (the
mini-batch's cross-entropy before its updates), ``task_acc_<j>`` (accuracy on task ``j``'s test classes, at every task
end: rows of the accuracy matrix) and ``final_acc`` (all classes, after the stream), with the probes (default
``gradcov`` and ``sparsity``) at every task end. Probes draw from the test split of the classes seen so far, never
from stored training samples: the learner itself keeps no buffer.

An activation's arguments are flags and config keys of their own (``--k 2``, ``slope: 0.5``): ``d``, ``a`` and ``h``
with the defaults of class_inc.yml, the others with the activation's defaults.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from interference.activation_spec import activation_spec
from probes import ProbeContext, ProbeRunner, make_probe

from ..algorithm import Algorithm
from ..errors import ConfigError
from ..inputs import read_yaml
from ..lifecycle import RunFolder
from .data import DATASETS, DataError, Dataset, load_dataset, seen_mask, stream_indices, task_classes
from .learner import ClassIncConfig, Progress, build_model, nll, seen_accuracy, task_accuracies, train_class_inc

__all__ = ["COMMANDS", "ClassIncSettings", "defaults", "method_name"]

HYPERPARAMS = Path(__file__).resolve().parent.parent / "hyperparams" / "class_inc.yml"
PROBE_INPUTS_PER_CLASS = 10  # test samples per class in the fixed probe inputs (sparsity)
SCALARS_FIXED = ("test_acc", "train_loss", "final_acc", "run_end")


def defaults(data: str) -> dict[str, Any]:
    """The dataset's defaults (``default`` <- its entry in class_inc.yml)."""
    table = read_yaml(HYPERPARAMS, "hyper-parameter")
    if data not in table:
        raise ConfigError(f"unknown dataset {data!r}; choose from {', '.join(DATASETS)}")
    return {**table["default"], **(table[data] or {})}


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass
class ClassIncSettings(ClassIncConfig):
    """class-inc's settings: the run's, its probes' and its device."""

    probe: list[str] = field(default_factory=lambda: ["gradcov", "sparsity"],
                             metadata={"help": "comma-separated probes of the list above (empty: none)"})
    device: str = field(default="cpu", metadata={"help": "torch device"})

    def __post_init__(self) -> None:
        for name in ("lr", "d", "a", "h"):
            v = getattr(self, name)
            if not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        for name in ("width", "batch_size", "updates", "conv_channels", "classes_per_task", "eval_every"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.eval_samples < 0:
            raise ValueError(f"eval_samples must be >= 0 (0: the whole test split), got {self.eval_samples!r}")
        for name, least, most in (("sigma_bias", 0.0, math.inf), ("ewc_lambda", 0.0, math.inf),
                                  ("ewc_gamma", 0.0, 1.0)):
            v = getattr(self, name)
            if v is not None and not least <= v <= most:
                raise ValueError(f"{name} must be a number in [{least:g}, {most:g}], got {v!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device cuda: this machine has no CUDA device")
        try:
            build_model(self, (1, 8, 8) if self.model == "cnn" else (4,), 2, 0)  # the activation's width rules
        except (ValueError, TypeError) as err:
            raise ValueError(f"--act {self.act} with width {self.width}: {err}") from None


def method_name(config: Mapping[str, Any]) -> str:
    """``<model>-<act>[-ewc]``, e.g. ``mlp-elephant`` (the paper's EMLP) or ``cnn-relu-ewc``."""
    return f"{config['model']}-{config['act']}" + ("-ewc" if config["ewc_lambda"] > 0 else "")


def _tag(config: Mapping[str, Any]) -> str:
    """The run folder's settings: learning rate and E always; the activation's swept settings where it takes them;
    EWC's where it is on; anything else that differs from the dataset's defaults."""
    spec = activation_spec(config["act"])
    parts = [f"lr{config['lr']:g}", f"E{config['updates']}"]
    if "a" in spec.arguments:
        parts.append(f"a{config['a']:g}")
    parts += [f"{k}{_text(config[k])}" for k in sorted(set(config) - _KEYS)]
    if config["sigma_bias"] is not None:
        parts.append(f"sb{config['sigma_bias']:g}")
    if config["layer_norm"] is not None:
        parts.append("ln" if config["layer_norm"] else "noln")
    if config["ewc_lambda"] > 0:
        parts += [f"lam{config['ewc_lambda']:g}", f"g{config['ewc_gamma']:g}"]
    base = defaults(config["data"])
    for key in ("d", "h", "conv_channels", "classes_per_task", "class_order", "eval_every", "eval_samples"):
        if key in ("d", "h") and key not in spec.arguments or key == "conv_channels" and config["model"] != "cnn":
            continue
        if config[key] != base[key]:
            parts.append(f"{key}{config[key]}")
    return "-".join(parts)


def _folder(config: Mapping[str, Any]) -> Path:
    """``<data>/<method>/w<width>-bs<batch>/<tag>``; data read from files: one ``<data>`` folder per location."""
    data = config["data"]
    if config["data_root"] is not None:
        where = str(Path(config["data_root"]).expanduser().resolve())
        data += "-" + hashlib.sha1(where.encode()).hexdigest()[:8]
    return Path(data) / method_name(config) / f"w{config['width']}-bs{config['batch_size']}" / _tag(config)


def train_class_inc_run(run: RunFolder, cfg: ClassIncSettings) -> dict[str, Any]:
    """Train every seed of ``cfg`` one after another, each into its own run log; the summary of their final
    accuracies (status ``nan`` if one diverged)."""
    try:
        data = load_dataset(cfg.data, cfg.data_root)
    except DataError as err:
        raise ConfigError(str(err)) from None
    if data.n_classes % cfg.classes_per_task:
        raise ConfigError(f"{cfg.data} has {data.n_classes} classes, not a multiple of classes_per_task "
                          f"{cfg.classes_per_task}")
    try:
        build_model(cfg, data.input_shape, data.n_classes, 0)
    except ValueError as err:
        raise ConfigError(f"--model {cfg.model} on {cfg.data} (samples of shape {data.input_shape}): {err}") from None
    final = {}
    for seed in cfg.seeds:
        final[str(seed)] = run_seed(cfg, data, seed, run.config, run.path / f"seed{seed}" / "run.h5")
        print(f"class-inc {method_name(run.config)} seed {seed}: final accuracy {final[str(seed)]:.4f}",
              file=sys.stderr, flush=True)
    acc = np.array(list(final.values()))
    ok = np.isfinite(acc).all()
    return {"final_acc": {k: v if math.isfinite(v) else None for k, v in final.items()},
            "mean_final_acc": float(acc.mean()) if ok else None,
            "sem_final_acc": float(acc.std(ddof=1) / math.sqrt(len(acc))) if ok and len(acc) > 1 else None,
            "status": "finished" if ok else "nan"}


def _probe_inputs(data: Dataset) -> torch.Tensor:
    """``PROBE_INPUTS_PER_CLASS`` test samples of every class (the first ones of each, in test order)."""
    idx = np.concatenate([np.flatnonzero(data.y_test == c)[:PROBE_INPUTS_PER_CLASS] for c in range(data.n_classes)])
    return torch.as_tensor(data.x_test[idx])


def run_seed(cfg: ClassIncConfig, data: Dataset, seed: int, config: Mapping[str, Any], path: Path) -> float:
    """Train one seed into its run log at ``path``; returns the final test accuracy over all classes."""
    device = config.get("device", "cpu")
    tasks = task_classes(data.n_classes, cfg.classes_per_task, order=cfg.class_order, seed=seed)
    ends = np.cumsum([len(ix) for ix in stream_indices(data.y_train, tasks, seed)]).tolist()
    subset = None
    if cfg.eval_samples and cfg.eval_samples < len(data.y_test):
        subset = np.sort(np.random.default_rng(0).choice(len(data.y_test), cfg.eval_samples, replace=False))
    probe_rng = np.random.default_rng([seed, 1])
    seen_task = [0]

    def sample(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``k`` test samples of the classes seen so far (the probes' source; the learner never sees them)."""
        pool = np.flatnonzero(seen_mask(data.y_test, tasks, seen_task[0]))
        idx = probe_rng.choice(pool, k, replace=len(pool) < k)  # a tiny test split: some samples twice
        return torch.as_tensor(data.x_test[idx], device=device), torch.as_tensor(data.y_test[idx], device=device)

    probes = [make_probe(n, every=None, at=ends) for n in config["probe"]]
    model0 = build_model(cfg, data.input_shape, data.n_classes, seed).to(device)
    ctx = ProbeContext(step=0, model=model0, losses={"nll": nll}, sample=sample, inputs=_probe_inputs(data).to(device))
    scalars = (*SCALARS_FIXED, *(f"task_acc_{j}" for j in range(len(tasks))))
    run_config = {"algo": "class-inc", **dict(config), "seeds": None, "seed": seed, "tasks": [list(t) for t in tasks]}
    runner = ProbeRunner(probes, path, example=ctx, config=run_config, seed=seed, scalars=scalars, device=device,
                         overwrite=True)

    def on_batch(p: Progress, model: torch.nn.Module) -> None:
        seen_task[0] = p.task
        runner.scalar("train_loss", p.samples, p.loss)
        if p.batch % cfg.eval_every == 0 or p.task_end:
            runner.scalar("test_acc", p.samples, seen_accuracy(model, data, tasks, p.task, subset, device))
        if p.task_end:  # a row of the accuracy matrix
            for j, acc in enumerate(task_accuracies(model, data, tasks, device)):
                runner.scalar(f"task_acc_{j}", p.samples, acc)
            ctx.step, ctx.model = p.samples, model
            runner.on_step(ctx)
        if not math.isfinite(p.loss):
            raise FloatingPointError(f"the training loss is {p.loss} after {p.samples} samples")

    status, last = None, [0]
    try:
        model = train_class_inc(cfg, data, seed, lambda p, m: (last.__setitem__(0, p.samples), on_batch(p, m)), device)
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            raise FloatingPointError(f"the parameters are not finite after {last[0]} samples")
        acc = seen_accuracy(model, data, tasks, len(tasks) - 1, None, device)
        runner.scalar("final_acc", ends[-1], acc)
        status = "finished"
    except FloatingPointError as err:
        print(f"class-inc seed {seed}: {err}; the run ends as diverged", file=sys.stderr)
        status, acc = "nan", float("nan")
    finally:
        if status is not None:
            runner.log.end(last[0], status)
        runner.close()
    return acc


CLASS_INC = Algorithm(
    "class-inc", "class-incremental streaming classification (the paper's appendix: Split MNIST/CIFAR-10 with MLP, "
    "CNN, EMLP, ECNN and Streaming EWC): one pass, no task boundaries, no buffer", ClassIncSettings,
    train_class_inc_run, folder=_folder, defaults=lambda values: defaults(values.get("data", "split-digits")),
    activation="act", key="command")
#: the run's settings (the activation's other arguments are keys beside them)
_KEYS = frozenset(CLASS_INC.fields) | {"command"}

COMMANDS = {"class-inc": CLASS_INC}
