"""Train a population and write one run folder per member, as ``agents.train dqn`` writes a run.

    python -m agents.population.run --env MountainCar-v0 --act elephant --seeds 0-4 --lrs 1e-3,3e-4 \\
        --buffers 100,10000 [--final-eps 0.01,0.1] [--eps-steps 1000,5000] [--steps N] [--set KEY=VALUE ...] \\
        --out runs/population

Members are the product of seeds x learning rates x buffer sizes (x final epsilons x decay steps); each gets the
config ``agents.train dqn`` would resolve for it and the same folder (``OUT/dqn/ENV/ACT/TAG/seedN``:
``config.yaml``, ``run.h5``, ``summary.json``), so ``reports`` and ``reports.classic`` read populations and single
runs alike. The log holds the episode returns and lengths, the TD loss and learning rate (as a single run's: the
first update, every hundredth of the run, the last); the run log's ``engine`` attribute says
``population:<implementation>``; the member's final Q-network is ``q_net.pt`` (its ``state_dict``). Probes (``--set
probe=[gradcov]`` ...) run per member on its own network and replay buffer, into its log, as in a single run. The
population checkpoints to ``OUT/populations/<key>.pkl`` (its members' folders listed in ``<key>.members.json``) and
``--resume`` continues it exactly.

As ``agents.train``, it holds every member folder's run lock (exit status 3 if another process writes into one) and
stops with exit status 4 and a one-line reason when a log or checkpoint cannot be written (full disk).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import pickle
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import astuple
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from agents.allocator import retain_freed_memory
from agents.commands import get_command
from agents.errors import EXIT_IO, ConfigError, RunWriteError, exit_status
from agents.inputs import int_list, parse_seeds
from agents.runfolder import OUTPUT_KEYS, holds_config, write_run_file
from agents.rl.checkpoint import CheckpointWriteError, write_atomic
from agents.rl.config import probe_arguments, resolve
from agents.runlock import run_lock
from agents.signals import STOP_SIGNALS, handling
from probes import ProbeContext, ProbeRunner, make_probe
from runlog import RunLogWriteError
from probes.sb3 import SCALARS

from . import MEMBER_KEYS, members_file, record_members, restarted_since
from .engine import Member, Population, member_q_net

__all__ = ["member_configs", "member_dirs", "train_population", "main"]

PROG = "python -m agents.population.run"


def member_configs(values: Mapping[str, Any], members: Sequence[Member]) -> list[dict[str, Any]]:
    """Each member's resolved ``dqn`` config (``values`` plus the member's fields, :data:`MEMBER_KEYS`, but those
    it leaves None)."""
    return [resolve("dqn", {**values, **{k: v for k, v in zip(MEMBER_KEYS, astuple(m)) if v is not None}})
            for m in members]


class MemberLog:
    """Member ``m``'s run log and probes, kept as :class:`probes.sb3.ProbeCallback` keeps a single run's: the same
    log layout, probes built from the member's config, its own probe RNG (seeded as a run's) and fixed probe inputs
    drawn from its replay buffer, ``resume`` (:meth:`state` from a checkpoint) continuing all of it exactly."""

    def __init__(self, pop: Population, m: int, config: Mapping[str, Any], path: Path, device: str,
                 resume: Mapping[str, Any] | None, extra_attrs: Mapping[str, Any]) -> None:
        self.pop, self.m, self.n_inputs = pop, m, int(config["probe_inputs"])
        self.rng = np.random.default_rng([config["seed"], 0x9E3779B9])
        probes = [make_probe(name, **probe_arguments(config, name)) for name in config["probe"]]
        # the member's QNetwork, loaded with its weights at each probe (only built where there are probes)
        self.model = member_q_net(config, config["seed"]).to(pop.device) if probes else None
        inputs = torch.zeros(self.n_inputs, pop.env.obs_dim)
        example = ProbeContext(step=0, inputs=inputs, **pop.member_probe_context(m, self.model, self.rng)) \
            if probes else ProbeContext(step=0, model=pop.base, inputs=inputs)
        self.runner = ProbeRunner(probes, path, example=example,
                                  config={k: v for k, v in config.items() if k not in OUTPUT_KEYS}, seed=config["seed"],
                                  scalars=SCALARS, device=device, extra_attrs=extra_attrs, overwrite=resume is None,
                                  keep=None if resume is None else resume["runner"]["counts"])
        self.inputs: torch.Tensor | None = None
        if resume is not None:
            self.runner.restore(resume["runner"])
            self.rng.bit_generator.state = resume["rng"]
            self.inputs = None if resume["inputs"] is None else torch.as_tensor(resume["inputs"], device=pop.device)

    def probe(self, step: int) -> None:
        """Run the probes due at ``step`` (after the env step, before storing and updating, as SB3's callbacks)."""
        if not self.runner.due(step):
            return
        if self.inputs is None:
            self.inputs = self.pop.stored_observations(self.m, self.n_inputs, self.rng)
            if self.inputs is None:
                return
        self.runner.on_step(ProbeContext(step=step, inputs=self.inputs,
                                         **self.pop.member_probe_context(self.m, self.model, self.rng)))

    def scalar(self, name: str, step: int, value: float) -> None:
        self.runner.scalar(name, step, value)

    def state(self) -> dict[str, Any]:
        return {"runner": self.runner.state(), "rng": self.rng.bit_generator.state,
                "inputs": None if self.inputs is None else self.inputs.cpu().numpy()}

    def close(self) -> None:
        self.runner.close()


def _checkpoint(path: Path, pop: Population, seen: Sequence[int], logs: Sequence[MemberLog], wall: float) -> None:
    """The whole population, the episodes its logs hold and their states, in one atomic pickle (the previous
    checkpoint stays in place if it cannot be written: :class:`CheckpointWriteError`)."""
    try:
        write_atomic(path, {"pop": pop, "seen": list(seen), "logs": [log.state() for log in logs], "wall": wall})
    except OSError as err:
        raise CheckpointWriteError(f"{path}: cannot write the checkpoint ({err.strerror or err}); the disk may be "
                                   "full") from err


def _checkpoint_path(out: Path, configs: Sequence[Mapping[str, Any]]) -> Path:
    """``OUT/populations/<key>.pkl``: one file per population (its members' configs make the key)."""
    key = hashlib.sha1(json.dumps([{k: v for k, v in c.items() if k not in OUTPUT_KEYS} for c in configs],
                                  sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Path(out) / "populations" / f"{key}.pkl"


#: what a member's finished run adds to its folder beside config.yaml and run.h5
RESULT_FILES = ("summary.json", "q_net.pt")


def _finished(dirs: Sequence[Path], configs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """The members' summaries if every one of them holds the summary of a population that ended (status "finished"
    or "nan") with its config (``config.yaml``), else None. A population writes them only at its end, after a fresh
    start or a resume removed them."""
    summaries = []
    for d, c in zip(dirs, configs):
        if not holds_config(d, c):
            return None
        try:
            summary = json.loads((d / "summary.json").read_text())
        except (OSError, ValueError):
            return None
        if summary.get("status") not in ("finished", "nan"):
            return None
        summaries.append(summary)
    return summaries


def _clear(dirs: Sequence[Path], fresh: bool) -> None:
    """Remove the members' results of an earlier attempt (resumed from the checkpoint: they are written again at
    the end) and, on a fresh start, a single run's files left in the folders (``agents.train dqn``'s model,
    checkpoint and replay), so that nothing in a folder is older than its run log."""
    from agents.rl.run import RUN_FILES

    for d in dirs:
        for name in (*RESULT_FILES, *(RUN_FILES if fresh else ())):
            if name == "run.h5":
                continue  # (the member's log replaces or continues it)
            if (d / name).is_dir():
                shutil.rmtree(d / name)
            else:
                (d / name).unlink(missing_ok=True)


def member_dirs(configs: Sequence[Mapping[str, Any]], out: str | Path) -> list[Path]:
    """Each member's run folder under ``out`` (the one ``agents.train dqn`` would write its run to)."""
    command = get_command("dqn")
    return [command.run_dir(c, Path(out)) for c in configs]


def train_population(values: Mapping[str, Any], members: Sequence[Member], out: str | Path,
                     implementation: str = "auto", device: str = "cpu", resume: bool = False,
                     checkpoint_every: int | None = None) -> list[dict[str, Any]]:
    """Train ``members`` on the config of ``values`` (flag values, as ``resolve`` takes them); their summaries.

    Every ``checkpoint_every`` steps (default: the config's ``checkpoint_every``, else a tenth of the run; 0: never)
    the whole population (networks, optimiser states, buffers, envs, generators, episodes) and its logs' record
    counts go to one atomic pickle; ``resume`` continues from it as if the run had not stopped (the logs cut back to
    the checkpoint's records). SIGINT or SIGTERM stop it after the current step with a checkpoint of that step
    (``run_end`` "interrupted" in the logs), then raise ``SystemExit(128 + signal)``. A member whose TD loss turns
    non-finite ends there as a diverged run does (``run_end`` "nan", summary status "nan"; at the step of that
    update, where a single run's callbacks stop it one env step later and log that step too); the others go on. An
    unreadable checkpoint is a ConfigError naming it; ``resume`` on a population that ended (its checkpoint gone,
    every member's ``summary.json`` written) returns those summaries and trains nothing. A failed write (full disk)
    of a checkpoint or a log stops the population: the members' logs end with ``run_end`` "write_error" where the
    disk still takes it, the last good checkpoint stays resumable, and the error (:class:`CheckpointWriteError`,
    :class:`runlog.RunLogWriteError`) propagates. The caller holds the members' run locks
    (:func:`member_dirs`). Sets the process's allocator for training (:func:`agents.allocator.retain_freed_memory`)."""
    retain_freed_memory()
    configs = member_configs(values, members)
    shared = {k: v for k, v in configs[0].items() if k not in (*MEMBER_KEYS, "derived")}
    for c in configs[1:]:
        if {k: v for k, v in c.items() if k not in (*MEMBER_KEYS, "derived")} != shared:
            raise ConfigError(f"population members may differ in {', '.join(MEMBER_KEYS)} only")
    dirs = member_dirs(configs, out)
    steps = configs[0]["n_timesteps"]
    if checkpoint_every is None:  # the config's (a grid's or --set's), as a single run's
        checkpoint_every = configs[0].get("checkpoint_every")
    every = max(1, steps // 10) if checkpoint_every is None else int(checkpoint_every)
    path = _checkpoint_path(Path(out), configs)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = None
    if not resume:
        path.unlink(missing_ok=True)  # a fresh start: an older checkpoint must not be resumed against its logs later
        members_file(path).unlink(missing_ok=True)
    elif not path.exists() and (done := _finished(dirs, configs)) is not None:
        print(f"{path.parent}: the population of {len(members)} finished already ({steps} steps); nothing to resume",
              file=sys.stderr)
        return done
    elif not path.exists():  # (a population regrouped since its checkpoint, e.g. after a grid's chunks moved)
        print(f"{path}: no checkpoint to resume from; the population of {len(members)} starts at step 0",
              file=sys.stderr)
    elif (restarted := restarted_since(path, dirs)) is not None:  # its logs are not this checkpoint's any more
        print(f"{path}: a run started afresh in {restarted} after this checkpoint was written; the checkpoint is "
              f"stale and removed, the population of {len(members)} starts at step 0", file=sys.stderr)
        path.unlink()
        members_file(path).unlink(missing_ok=True)
    if resume and path.exists():
        try:
            with open(path, "rb") as f:
                state = pickle.load(f)
        except Exception as err:  # a truncated or foreign file: say which and what to do, not an unpickling trace
            raise ConfigError(f"{path}: the population checkpoint is unreadable ({type(err).__name__}: {err}); "
                              "delete it to start the population afresh") from None
        print(f"{path}: resuming the population of {len(members)} at step {state['pop'].num_timesteps}",
              file=sys.stderr)
    _clear(dirs, fresh=state is None)
    pop = state["pop"] if state else Population(configs[0], members, implementation=implementation, device=device)
    seen = state["seen"] if state else [0] * len(members)
    logs = []
    try:
        for m, (c, d) in enumerate(zip(configs, dirs)):
            d.mkdir(parents=True, exist_ok=True)
            logs.append(MemberLog(pop, m, c, d / "run.h5", device, state["logs"][m] if state else None,
                                  extra_attrs={"engine": f"population:{pop.implementation}",
                                               "population_size": len(members)}))
            if state is None:  # (after its log: a start killed in between leaves no config.yaml beside another's log)
                write_run_file(d / "config.yaml", yaml.safe_dump(c, sort_keys=False))
        # for the grid runner and later resumes: which runs, and which of their logs, this checkpoint holds
        record_members(path, dirs, Path(out), [log.runner.log.log_id for log in logs])
    except BaseException:  # (the logs opened so far: their files and locks are not left to the process's end)
        for log in logs:
            log.close()
        raise
    # the TD loss and learning rate of the first update, of the first at or after each hundredth of the run, and of
    # the last (probes.sb3.ProbeCallback's cadence with one update per step)
    loss_every, first_update = max(1, steps // 100), int(configs[0]["learning_starts"]) + 1
    start = time.perf_counter() - (state["wall"] if state else 0.0)
    stop: list[int] = []  # the stop signal, once one came: the population stops after the step it is in
    try:
        with handling(STOP_SIGNALS, lambda signum, frame: stop.append(signum)):
            while pop.num_timesteps < steps and not stop and not pop.diverged.all():  # (all ended: nothing to do)
                if every and pop.num_timesteps % every == 0 and pop.num_timesteps and state is None:
                    _checkpoint(path, pop, seen, logs, time.perf_counter() - start)
                state = None  # (a resumed run does not rewrite the checkpoint it started from)
                live = [(m, log) for m, log in enumerate(logs) if not pop.diverged[m]]
                pop.step(before_store=lambda: [log.probe(pop.num_timesteps) for _, log in live])
                t = pop.num_timesteps
                for m, log in live:
                    for step, ret, length in pop.episodes[m][seen[m]:]:
                        log.scalar("episode_return", step, ret)
                        log.scalar("episode_length", step, length)
                    seen[m] = len(pop.episodes[m])
                    if pop.diverged[m]:  # this step's loss was not finite: the member's run ends here, as a run's
                        log.scalar("loss", t, float(pop.last_losses[m]))
                        log.runner.log.end(t, "nan")
                        print(f"{dirs[m]}: the TD loss is not finite at step {t}; the member stopped there",
                              file=sys.stderr)
                    elif t >= first_update and (t % loss_every == 0 or t in (first_update, steps)):
                        log.scalar("loss", t, float(pop.last_losses[m]))  # as probes.sb3 logs a run's updates
                        log.scalar("learning_rate", t, members[m].learning_rate)
        ongoing = [log for m, log in enumerate(logs) if not pop.diverged[m]]
        if stop and pop.num_timesteps < steps:  # checkpoint the step just finished (nothing is lost), mark the
            _checkpoint(path, pop, seen, logs, time.perf_counter() - start)  # logs, exit as a stopped run does
            for log in ongoing:
                log.runner.log.end(pop.num_timesteps, "interrupted")
            print(f"{path}: stopped by signal {stop[0]} at step {pop.num_timesteps} of {steps}, checkpointed; "
                  "--resume continues", file=sys.stderr)
            raise SystemExit(128 + stop[0])
        for m, d in enumerate(dirs):  # the weights on disk before the logs say how the runs ended
            # (cloned: a member's tensors are views of the population's, whose whole storage torch.save would write)
            state = {k: v.cpu().clone() for k, v in pop.member_state(m).items()}
            write_run_file(d / "q_net.pt", lambda f, state=state: torch.save(state, f))
        for log in ongoing:
            log.runner.log.end(steps, "finished")
    except (RunLogWriteError, RunWriteError):
        for m, log in enumerate(logs):
            if not pop.diverged[m]:
                with contextlib.suppress(RunLogWriteError):  # the failure itself is being reported
                    log.runner.log.end(pop.num_timesteps, "write_error")
        raise
    finally:
        for log in logs:
            log.close()
    wall = time.perf_counter() - start
    summaries = []
    for m, (c, d) in enumerate(zip(configs, dirs)):
        end = int(pop.diverged[m]) or steps
        returns = [r for step, r, _ in pop.episodes[m] if step <= end]
        k = max(1, int(np.ceil(0.1 * len(returns)))) if returns else 0
        summary = {"status": "nan" if pop.diverged[m] else "finished", "steps": end, "episodes": len(returns),
                   "final_return": float(np.mean(returns[-k:])) if returns else None,
                   "steps_per_second": steps / wall, "population_steps_per_second": steps * len(members) / wall,
                   "wall_seconds": wall, "run_dir": str(d), "engine": f"population:{pop.implementation}"}
        write_run_file(d / "summary.json", json.dumps(summary, indent=1))  # last: the folder's "finished"
        summaries.append(summary)
    path.unlink(missing_ok=True)  # finished: the logs, weights and summaries hold it (until here it stays resumable)
    members_file(path).unlink(missing_ok=True)
    return summaries


def _numbers(text: str, kind: type, flag: str) -> list[Any]:
    """A flag's comma-separated numbers; ConfigError naming the flag and the bad item."""
    try:
        return [kind(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated {kind.__name__}s, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="MountainCar-v0")
    parser.add_argument("--act", default="elephant")
    parser.add_argument("--seeds", default="0", help="e.g. 0-4 or 0,2,5")
    parser.add_argument("--lrs", default=None, help="comma-separated learning rates (default: the env's)")
    parser.add_argument("--buffers", default=None, help="comma-separated buffer sizes (default: the env's)")
    parser.add_argument("--final-eps", default=None,
                        help="comma-separated final epsilons of the members' schedules (default: the env's)")
    parser.add_argument("--eps-steps", default=None,
                        help="comma-separated env steps of epsilon's decay after learning_starts (default: the env's)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--implementation", default="auto")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                        help="env steps between population checkpoints (default: a tenth of the run; 0: none)")
    parser.add_argument("--resume", action="store_true", help="continue from the population's checkpoint")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    values: dict[str, Any] = {"env": args.env, "act": args.act, **({"n_timesteps": args.steps} if args.steps else {})}
    if args.set:
        values["set"] = args.set
    try:
        base = resolve("dqn", values)
        lrs = _numbers(args.lrs, float, "--lrs") if args.lrs else [base["learning_rate"]]
        buffers = _numbers(args.buffers, int, "--buffers") if args.buffers else [base["buffer_size"]]
        finals = _numbers(args.final_eps, float, "--final-eps") if args.final_eps else [None]
        decays = _numbers(args.eps_steps, int, "--eps-steps") if args.eps_steps else [None]
        members = [Member(s, lr, b, exploration_final_eps=f, exploration_steps=n)
                   for s, lr, b, f, n in itertools.product(parse_seeds(int_list(args.seeds, "--seeds")), lrs, buffers, finals,
                                                                 decays)]
        with contextlib.ExitStack() as locks:  # one writer per run folder, as agents.train
            for d in member_dirs(member_configs(values, members), args.out):
                d.mkdir(parents=True, exist_ok=True)
                locks.enter_context(run_lock(d))
            summaries = train_population(values, members, args.out, args.implementation, args.device, args.resume,
                                         args.checkpoint_every)
    except Exception as err:  # noqa: BLE001 - the errors a run ends with: one line and their status; others raise
        status = exit_status(err) or (2 if isinstance(err, ValueError) else None)
        if status is None:
            raise
        print(f"{PROG}: error: {err}", file=sys.stderr)
        if isinstance(err, RunLogWriteError):  # as agents.train: HDF5 objects of a failed log can crash the exit
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_IO)
        return status
    for s in summaries:
        print(f"{s['run_dir']}: final return {s['final_return']}")
    print(f"{len(members)} members, {summaries[0]['population_steps_per_second']:,.0f} env steps/s in all",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
