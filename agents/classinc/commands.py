"""``python -m agents.train class-inc``: class-incremental streaming classification, several seeds per run folder.

Run folders: ``OUT/class-inc/<data>/<model>-<act>[-ewc]/w<width>-bs<batch>/<lr, E, activation and EWC settings>/
seed<k>/run.h5``. Each seed's run log holds the scalars ``test_acc`` (test accuracy over the classes seen so far,
every ``eval_every`` mini-batches and at each task's end; step = training samples seen), ``train_loss`` (the
mini-batch's cross-entropy before its updates), ``task_acc_<j>`` (accuracy on task ``j``'s test classes, at every task
end: rows of the accuracy matrix) and ``final_acc`` (all classes, after the stream), with the probes (default
``gradcov`` and ``sparsity``) at every task end. Probes draw from the test split of the classes seen so far, never
from stored training samples: the learner itself keeps no buffer.

An activation's arguments are flags and config keys of their own (``--k 2``, ``slope: 0.5``): ``d``, ``a`` and ``h``
with the defaults of class_inc.yml, the others with the activation's defaults (an argument named like another
setting keeps its default).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from collections.abc import Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from interference.activation_spec import activation_names, activation_spec
from probes import PROBES, ProbeContext, ProbeRunner, make_probe

from ..commands import add_activation_flags, probe_list
from ..errors import ConfigError
from ..inputs import parse_seeds, read_yaml
from ..lifecycle import RunFolder
from .data import DATASETS, DataError, Dataset, load_dataset, seen_mask, stream_indices, task_classes
from .learner import MODELS, ClassIncConfig, Progress, build_model, nll, seen_accuracy, task_accuracies, \
    train_class_inc

__all__ = ["COMMANDS", "ClassInc", "defaults", "method_name"]

HYPERPARAMS = Path(__file__).resolve().parent.parent / "hyperparams" / "class_inc.yml"
PROBE_INPUTS_PER_CLASS = 10  # test samples per class in the fixed probe inputs (sparsity)
SCALARS_FIXED = ("test_acc", "train_loss", "final_acc", "run_end")
#: the config keys of the run's settings (the activation's arguments beyond d, a and h are keys of their own)
SETTINGS = frozenset(f.name for f in fields(ClassIncConfig)) - {"act_kwargs"}
#: keys an activation argument may not take over: the run's settings and the CLI's own
RESERVED = SETTINGS | {"act_kwargs", "seed", "probe", "device", "command", "out", "import", "help"}


def defaults(data: str) -> dict[str, Any]:
    """The dataset's defaults (``default`` <- its entry in class_inc.yml)."""
    table = read_yaml(HYPERPARAMS, "hyper-parameter")
    if data not in table:
        raise ConfigError(f"unknown dataset {data!r}; choose from {', '.join(DATASETS)}")
    return {**table["default"], **(table[data] or {})}


def _activation_keys() -> set[str]:
    """Config keys of the registered activations' arguments (those not in :data:`RESERVED`)."""
    return {a for n in activation_names() for a in activation_spec(n).arguments} - RESERVED


def _config(values: Mapping[str, Any]) -> ClassIncConfig:
    """The run's settings of a flat config, seeds left out (unchecked)."""
    return ClassIncConfig(**{k: v for k, v in values.items() if k in SETTINGS - {"seeds"}},
                          act_kwargs={k: v for k, v in values.items() if k in _activation_keys()})


def _config_dict(cfg: ClassIncConfig) -> dict[str, Any]:
    """``cfg`` as a flat config: the activation's arguments are keys of their own."""
    out = asdict(cfg)
    act_kwargs = out.pop("act_kwargs")
    return {**out, **act_kwargs, "seeds": list(cfg.seeds)}


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _check(cfg: ClassIncConfig) -> None:
    if cfg.model not in MODELS:
        raise ConfigError(f"unknown model {cfg.model!r}; choose from {', '.join(MODELS)}")
    if cfg.act not in activation_names():
        raise ConfigError(f"unknown activation {cfg.act!r}; choose from {', '.join(activation_names())}")
    for name in ("lr", "d", "a", "h"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"{name} must be a positive number, got {v!r}")
    for name in ("width", "batch_size", "updates", "conv_channels", "classes_per_task", "eval_every"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {v!r}")
    if isinstance(cfg.eval_samples, bool) or not isinstance(cfg.eval_samples, int) or cfg.eval_samples < 0:
        raise ConfigError(f"eval_samples must be >= 0 (0: the whole test split), got {cfg.eval_samples!r}")
    for name, least, most in (("sigma_bias", 0.0, math.inf), ("ewc_lambda", 0.0, math.inf), ("ewc_gamma", 0.0, 1.0)):
        v = getattr(cfg, name)
        if v is None and name == "sigma_bias":
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not least <= v <= most or math.isnan(v):
            raise ConfigError(f"{name} must be a number in [{least:g}, {most:g}], got {v!r} (YAML reads 1e4 as a "
                              "string: write 1.0e+4 or 10000)")
    if cfg.layer_norm is not None and not isinstance(cfg.layer_norm, bool):
        raise ConfigError(f"layer_norm must be true, false or unset, got {cfg.layer_norm!r}")
    if cfg.class_order not in ("fixed", "random"):
        raise ConfigError(f"class_order must be fixed or random, got {cfg.class_order!r}")
    if cfg.data not in DATASETS:
        raise ConfigError(f"unknown dataset {cfg.data!r}; choose from {', '.join(DATASETS)}")


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
    parts += [f"{k}{_text(config[k])}" for k in sorted(_activation_keys() & set(config))]
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


class ClassInc:
    name = "class-inc"
    help = ("class-incremental streaming classification (the paper's appendix: Split MNIST/CIFAR-10 with MLP, CNN, "
            "EMLP, ECNN and Streaming EWC): one pass, no task boundaries, no buffer")

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--data", choices=DATASETS, help="split-digits (default; scikit-learn's bundled 8x8 digits), "
                       "split-mnist / split-fashion (IDX files), split-cifar10 (python pickle batches), embed "
                       "(.npz or folder of .npy: x_train, y_train, x_test, y_test)")
        p.add_argument("--data-root", dest="data_root",
                       help="where the dataset's files are (split-fashion defaults to Debian's "
                            "/usr/share/datasets/fashion-mnist; embed: the .npz file or folder)")
        p.add_argument("--model", choices=MODELS, help="mlp (default) or cnn (conv 3x3 + ReLU + 2x2 max-pool first)")
        p.add_argument("--act", choices=activation_names(),
                       help="the feature layer's activation (default relu; elephant gives EMLP/ECNN)")
        p.add_argument("--width", type=int, help="feature units (default 1000; the paper: 1000 and 10000)")
        p.add_argument("--layer-norm", dest="layer_norm", action=argparse.BooleanOptionalAction, default=None,
                       help="LayerNorm before the activation (default: the activation's convention: Elephant yes, as "
                            "the authors' EMLP; ReLU no)")
        p.add_argument("--sigma-bias", dest="sigma_bias", type=float,
                       help="spread of the feature layer's biases (default: the activation's convention: Elephant "
                            "0.4, others zero biases)")
        p.add_argument("--d", type=float, help="Elephant d (default 4)")
        p.add_argument("--a", type=float, help="Elephant a (default 0.08; the paper sweeps 0.02 .. 0.32)")
        p.add_argument("--h", type=float, help="Elephant h (default 1)")
        add_activation_flags(p, RESERVED)
        p.add_argument("--conv-channels", dest="conv_channels", type=int, help="cnn: convolution channels (64)")
        p.add_argument("--lr", type=float, help="RMSprop learning rate (decay 0.999)")
        p.add_argument("--batch-size", dest="batch_size", type=int,
                       help="mini-batch size (default 125, split-digits 10)")
        p.add_argument("--updates", type=int, help="E: optimisation steps per mini-batch (default 1)")
        p.add_argument("--ewc-lambda", dest="ewc_lambda", type=float, help="Streaming EWC strength (0: off)")
        p.add_argument("--ewc-gamma", dest="ewc_gamma", type=float, help="Streaming EWC decay (default 0.99)")
        p.add_argument("--classes-per-task", dest="classes_per_task", type=int, help="classes per task (2)")
        p.add_argument("--class-order", dest="class_order", choices=("fixed", "random"),
                       help="fixed: (0,1), (2,3), ...; random: a permutation drawn by the seed")
        p.add_argument("--eval-every", dest="eval_every", type=int,
                       help="evaluate every N mini-batches (and at every task's end)")
        p.add_argument("--eval-samples", dest="eval_samples", type=int,
                       help="evaluate on a fixed random subset of this many test samples (0: all)")
        p.add_argument("--seeds", help="comma-separated seeds, one run log each (default 0)")
        p.formatter_class = argparse.RawDescriptionHelpFormatter
        g = p.add_argument_group("probes (at task ends, logged to each seed's run log)",
                                 f"probes for --probe (--import MODULE adds a plugin's):\n{probe_list()}")
        g.add_argument("--probe", metavar="NAMES",
                       help="comma-separated probes of the list above (default gradcov,sparsity; empty: none)")
        p.add_argument("--device", help="torch device (default cpu)")

    def make_config(self, values: Mapping[str, Any]) -> dict[str, Any]:
        values = dict(values)
        data = values.get("data", "split-digits")
        if data not in DATASETS:
            raise ConfigError(f"unknown dataset {data!r}; choose from {', '.join(DATASETS)}")
        act_keys = _activation_keys() & set(values)
        extra = set(values) - SETTINGS - act_keys - {"seed", "probe", "device"}
        if extra:
            raise ConfigError(f"class-inc does not take {', '.join(sorted(extra))}")
        given = {k for k, v in values.items() if v is not None}
        act = values.get("act") or defaults(data)["act"]
        if act not in activation_names():
            raise ConfigError(f"unknown activation {act!r}; choose from {', '.join(activation_names())}")
        spec = activation_spec(act)
        ignored = [k for k in ("d", "a", "h", *sorted(act_keys)) if k in given and k not in spec.arguments]
        ignored += [k for k in ("conv_channels",) if k in given and (values.get("model") or "mlp") != "cnn"]
        ignored += [k for k in ("ewc_gamma",) if k in given and not values.get("ewc_lambda")]
        if ignored:
            raise ConfigError(f"{', '.join(ignored)} would be ignored here ({act} takes "
                              f"{', '.join(spec.arguments) or 'no arguments'}; conv_channels is for "
                              "--model cnn; ewc_gamma needs --ewc-lambda > 0)")
        merged = {**defaults(data), **{k: v for k, v in values.items() if k in SETTINGS and v is not None}}
        cfg = _config(merged)
        cfg.seeds = parse_seeds(values.get("seeds", values.get("seed", (0,))))
        try:
            cfg.act_kwargs = spec.parse_arguments({k: values[k] for k in act_keys if values[k] is not None})
        except ValueError as err:
            raise ConfigError(str(err)) from None
        _check(cfg)
        try:
            build_model(cfg, (1, 8, 8) if cfg.model == "cnn" else (4,), 2, 0)  # the activation's width rules
        except (ValueError, TypeError) as err:
            raise ConfigError(f"--act {cfg.act} with width {cfg.width}: {err}") from None
        probes = values.get("probe", "gradcov,sparsity")
        probes = [p for p in (probes.split(",") if isinstance(probes, str) else probes) if p]
        unknown = [p for p in probes if p not in PROBES]
        if unknown:
            raise ConfigError(f"unknown probe {unknown[0]!r}; choose from {', '.join(sorted(PROBES))}")
        device = values.get("device") or "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError("--device cuda: this machine has no CUDA device")
        return {"command": self.name, **_config_dict(cfg), "probe": probes, "device": device}

    def run_dir(self, config: Mapping[str, Any], out: Path) -> Path:
        data = config["data"]
        if config["data_root"] is not None:  # files read from disk: one folder per location
            where = str(Path(config["data_root"]).expanduser().resolve())
            data += "-" + hashlib.sha1(where.encode()).hexdigest()[:8]
        return (Path(out) / self.name / data / method_name(config)
                / f"w{config['width']}-bs{config['batch_size']}" / _tag(config))

    def train(self, run: RunFolder) -> dict[str, Any]:
        config, run_dir = run.config, run.path
        cfg = _config(config)
        cfg.seeds = tuple(config["seeds"])
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
            raise ConfigError(f"--model {cfg.model} on {cfg.data} (samples of shape {data.input_shape}): {err}") \
                from None
        run.start()
        final = {}
        for seed in cfg.seeds:
            final[str(seed)] = run_seed(cfg, data, seed, config, run_dir / f"seed{seed}" / "run.h5")
            print(f"class-inc {method_name(config)} seed {seed}: final accuracy {final[str(seed)]:.4f}",
                  file=sys.stderr, flush=True)
        acc = np.array(list(final.values()))
        ok = np.isfinite(acc).all()
        summary = {"final_acc": {k: v if math.isfinite(v) else None for k, v in final.items()},
                   "mean_final_acc": float(acc.mean()) if ok else None,
                   "sem_final_acc": float(acc.std(ddof=1) / math.sqrt(len(acc))) if ok and len(acc) > 1 else None,
                   "status": "finished" if ok else "nan"}
        return run.finish(summary)


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


COMMANDS = {"class-inc": ClassInc()}
