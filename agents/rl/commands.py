"""``python -m agents.train {dqn,rainbow,ppo,sac}``: the RL commands (the :class:`agents.commands.Command` protocol), one per
declaration in :mod:`agents.rl.algos`."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agents.commands import probe_list
from agents.lifecycle import RunFolder
from interference.activation_spec import ActArg, activation_names, activation_spec

from .algos import ALGOS
from .config import act_args, resolve, run_tag
from .settings import checks, describe

__all__ = ["RLCommand", "COMMANDS"]

_EPILOG = """\
Settings come from agents/hyperparams/{algo}.yml (`default`, `atari` for ALE ids, then the env's entry), then
--config FILE, then flags; the resolved config is saved as RUN_DIR/config.yaml. Runs go to
OUT/{algo}/ENV/ACT[/SETTINGS]/seedN/ (SETTINGS lists what differs from the defaults) with run.h5 (probes,
episode returns, losses), config.yaml, model.zip and summary.json. Ctrl-C or SIGTERM stops cleanly (model and log
saved, exit status 130 / 143); a NaN loss stops the run with a message (exit status 1).

examples:
  python -m agents.train {algo} --env {env} --act elephant --seed 0
  python -m agents.train {algo} --env {env} --act relu --match-width --lr 3e-4
  python -m agents.train {algo} --env {env} --act fta --k 20 --bound 20 --probe gradcov,sparsity --probe-every 1000
"""


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions and the epilog as written (the probe list, the settings), defaults shown."""


def _int(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value != int(value):
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    return int(value)  # accepts 5e4


def _activation_arguments() -> dict[str, tuple[ActArg, list[str]]]:
    """Each activation argument (from the registered specs): its first declaration and the activations taking it."""
    out: dict[str, tuple[ActArg, list[str]]] = {}
    for name in activation_names():
        for arg, declared in activation_spec(name).arguments.items():
            out.setdefault(arg, (declared, []))[1].append(name)
    return {arg: out[arg] for arg in act_args()}


class RLCommand:
    """One SB3 algorithm as an ``agents.train`` subcommand."""

    def __init__(self, algo: str) -> None:
        self.name = algo
        self.help = ALGOS[algo].help

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        algo = self.name
        parser.formatter_class = _Formatter
        spec = ALGOS[algo]
        parser.epilog = _EPILOG.format(algo=algo, env=spec.default_env) + \
            f"\nsettings (keys of --set, --config files and agents/hyperparams/{algo}.yml):\n{describe(spec.settings)}\n"
        S = argparse.SUPPRESS  # unset flags stay out of the values: the YAML files supply the defaults
        g = parser.add_argument_group("environment and training")
        g.add_argument("--env", default=S, metavar="ENV",
                       help=f"Gymnasium id, Catcher-PLE-v0 / Pixelcopter-PLE-v0, or an Atari id such as ALE/Amidar-v5 "
                            f"(default: {spec.default_env})")
        g.add_argument("--steps", type=_int, default=S, metavar="N", help="env steps to train (default: per env)")
        g.add_argument("--lr", type=float, default=S, metavar="X", help="learning rate (default: per env)")
        if "buffer_size" in checks(spec.settings):
            g.add_argument("--buffer-size", dest="buffer_size", type=_int, default=S, metavar="N",
                           help="replay buffer size in transitions (paper's classic study: 32 ... 10000)")
        g.add_argument("--batch-size", dest="batch_size", type=_int, default=S, metavar="N", help="minibatch size")
        g.add_argument("--seed", type=_int, default=S, metavar="N", help="random seed (default: 0)")
        g.add_argument("--seeds", dest="seed_list", default=S, metavar="SEEDS",
                       help="several runs, one per seed (e.g. 0-31 or 0,2,5), each in its own run folder"
                            + (": trained together as one population (one process) where the population engine "
                               "takes the env and settings, else one after another" if spec.population else
                               ", one after another"))
        g.add_argument("--device", default=S, metavar="DEV",
                       help="cpu, cuda, cuda:N or auto (default: cpu; small MLPs are fastest on CPU)")
        g.add_argument("--threads", type=_int, default=S, metavar="N",
                       help="torch threads (default: 1 for MLPs, torch's default for CNNs)")
        g.add_argument("--config", default=S, metavar="FILE",
                       help="YAML file of settings (same keys as a run's config.yaml); overrides the per-env defaults, "
                            "flags override it")
        g.add_argument("--set", action="append", default=S, metavar="KEY=VALUE",
                       help="any other setting, e.g. --set target_update_interval=200 (repeatable; YAML values)")
        g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=S,
                       help="progress bar on stderr (default: when stderr is a terminal)")

        a = parser.add_argument_group("network and activation")
        a.add_argument("--act", default=S, metavar="ACT",
                       help=f"hidden activation: {', '.join(activation_names())} (default: elephant)")
        for arg, (declared, takes) in _activation_arguments().items():
            text = f"{declared.help} [{', '.join(takes)}]"
            if declared.type is bool:
                a.add_argument(f"--{arg}", action=argparse.BooleanOptionalAction, default=S, help=text)
            else:
                a.add_argument(f"--{arg.replace('_', '-')}", dest=arg, type=_int if declared.type is int else float,
                               default=S, metavar="N" if declared.type is int else "X", help=text)
        a.add_argument("--sigma-bias", dest="sigma_bias", type=float, default=S, metavar="X",
                       help="spread hidden biases evenly over [-sqrt(3) X, sqrt(3) X] (default: per env for Elephant, "
                            "zero biases for the others)")
        a.add_argument("--ln", action=argparse.BooleanOptionalAction, default=S,
                       help="LayerNorm before the activation (default: on for Elephant only)")
        a.add_argument("--hidden", default=S, metavar="W[,W...]",
                       help="hidden Linear widths, e.g. 1000 or 256,256 (with --match-width: the Elephant reference)")
        a.add_argument("--match-width", dest="match_width", action=argparse.BooleanOptionalAction, default=S,
                       help="pick the hidden width with the parameter count of the Elephant network of --hidden widths "
                            "(e.g. ReLU ~1667 for Elephant 1000 on MountainCar)")

        p = parser.add_argument_group(
            "probes (logged to RUN_DIR/run.h5)",
            f"probes for --probe (--import MODULE adds a plugin's):\n{probe_list()}")
        p.add_argument("--probe", default=S, metavar="NAMES",
                       help="comma-separated probes of the list above, e.g. gradcov,sparsity (episode returns and "
                            "losses are always logged)")
        p.add_argument("--probe-every", dest="probe_every", type=_int, default=S, metavar="N",
                       help="env steps between probe records (default: a tenth of the run)")
        p.add_argument("--scale-probe-at", dest="scale_probe_at", action="store_const", const=True, default=S,
                       help="scale the probes' chosen steps (probe_kwargs ...at; Atari: the paper's gradient "
                            "covariance at 0.2M, 6.2M and 12.2M of 12.5M steps) to this run's length")
        g.add_argument("--checkpoint-every", dest="checkpoint_every", type=_int, default=S, metavar="N",
                       help="env steps between checkpoints for --resume (default: a tenth of the run; 0: none)")
        g.add_argument("--sb3-log", dest="sb3_log", default=S, metavar="FORMATS",
                       help="also write SB3's own logger outputs to RUN_DIR/sb3, e.g. csv or csv,tensorboard (for "
                            "TensorBoard and other tools that read SB3 logs; tensorboard needs .[tensorboard])")

    def make_config(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return resolve(self.name, {k: v for k, v in values.items() if v is not None})

    def run_dir(self, config: Mapping[str, Any], out: Path) -> Path:
        path = Path(out) / self.name / config["env"].replace("/", "-") / config["act"]
        tag = run_tag(config)
        if tag:
            path = path / tag
        return path / f"seed{config['seed']}"

    resumable = True

    @property
    def population(self) -> Any:
        """The algorithm's population engine (:class:`agents.commands.Population`), or None."""
        where = ALGOS[self.name].population
        if where is None:
            return None
        module, _, name = where.partition(":")
        return getattr(importlib.import_module(module), name)

    def train(self, run: RunFolder) -> dict[str, Any]:
        from .run import train_run

        return train_run(run)


COMMANDS: dict[str, RLCommand] = {algo: RLCommand(algo) for algo in ALGOS}
