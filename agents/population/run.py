"""A population written as one run folder per member, as ``agents.train dqn`` writes a run.

    python -m agents.train dqn --env MountainCar-v0 --act elephant --seeds 0-31 --out runs

trains the 32 runs as one population in one process (:data:`POPULATION`, the DQN declaration's population engine;
Atari ids with ``atari_env: ale-vector``: :class:`agents.population.atari.AtariPopulation`);
a grid with ``engine: population`` (:mod:`agents.grid`) also crosses learning rates, buffer sizes and epsilon
schedules (:data:`MEMBER_KEYS`). Each member gets the config ``agents.train dqn`` would resolve for it and the same
folder (``OUT/dqn/ENV/ACT/TAG/seedN``: ``config.yaml``, ``run.h5``, ``summary.json``, ``DONE.json``), so ``reports``
and ``reports.classic`` read populations and single runs alike. The log holds the episode returns and lengths, the TD
loss and learning rate (as a single run's: the first update, every hundredth of the run, the last); the run log's
``engine`` attribute says ``population:<implementation>``; the member's final Q-network is ``q_net.pt`` (its
``state_dict``). Probes (``--probe gradcov`` ...) run per member on its own network and replay buffer, into its log,
as in a single run; so do the Atari members' evaluations (``eval_every``: greedy whole games, ``eval_return``). The population checkpoints to ``OUT/populations/<key>.pkl`` (its members' folders listed in
``<key>.members.json``) and ``--resume`` continues it exactly.

Every member folder is locked and written through :class:`agents.lifecycle.RunFolder`, as a single run's: exit
status 3 if another process writes into one, 4 with a one-line reason when a log or checkpoint cannot be written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
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

from agents.allocator import retain_freed_memory
from agents.commands import get_command
from agents.errors import ConfigError, RunWriteError
from agents.lifecycle import FINISHED, RunFolder, open_runs
from agents.runfolder import OUTPUT_KEYS
from agents.rl.checkpoint import CHECKPOINT, REPLAY_DIR, CheckpointWriteError, write_atomic
from agents.rl.envs import is_atari
from agents.rl.evaluation import EVAL_SEED_OFFSET
from agents.rl.frame_buffer import prune_chunks
from agents.rl.config import probe_arguments, resolve
from agents.signals import STOP_SIGNALS, handling
from probes import ProbeContext, ProbeRunner, make_probe
from runlog import RunLogWriteError
from probes.sb3 import SCALARS

from . import MEMBER_KEYS, checkpointed_groups, members_file, record_members, restarted_since
from .device import DEVICE_MODES, DevicePopulation, device_refusal
from .atari import AtariPopulation, atari_refusal
from .atari_groups import NETWORK_KEYS, AtariGroups, network_key, shared_key
from .engine import Member, Population, config_refusal, member_q_net
from . import memory, timing

__all__ = ["member_configs", "member_dirs", "train_population", "run_population", "POPULATION"]

#: the Atari engines: members with frame replays and evaluations
ATARI = (AtariPopulation, AtariGroups)


def member_configs(values: Mapping[str, Any], members: Sequence[Member], algo: str = "dqn") -> list[dict[str, Any]]:
    """Each member's resolved ``algo`` config (``values`` plus the member's fields, :data:`MEMBER_KEYS`, but those
    it leaves None)."""
    return [resolve(algo, {**values, **{k: v for k, v in zip(MEMBER_KEYS, astuple(m)) if v is not None}})
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
        inputs = torch.zeros(self.n_inputs, 4, 84, 84, dtype=torch.uint8) if isinstance(pop, ATARI) \
            else torch.zeros(self.n_inputs, pop.env.obs_dim)
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


def _checkpoint(path: Path, pop: Population, seen: Sequence[int], logs: Sequence[MemberLog], wall: float,
                dirs: Sequence[Path]) -> None:
    """The whole population, the episodes its logs hold and their states, in one atomic pickle (the previous
    checkpoint stays in place if it cannot be written: :class:`CheckpointWriteError`). An Atari population's frame
    replays are not in the pickle: each member's new frames go to chunk files in its folder's ``replay/`` first (as
    a single run's checkpoint writes them), the pickle names the chunks, and chunks no checkpoint needs are
    removed after it is in place."""
    replays = pop.replay if isinstance(pop, ATARI) else None
    try:
        chunks = [buf.save_frames(d / REPLAY_DIR) for buf, d in zip(replays, dirs)] if replays else None
        with contextlib.ExitStack() as stack:
            for buf in replays or []:
                stack.enter_context(buf.frames_in_chunks())
            write_atomic(path, {"pop": pop, "seen": list(seen), "logs": [log.state() for log in logs], "wall": wall,
                                "replay_chunks": chunks})
    except OSError as err:
        raise CheckpointWriteError(f"{path}: cannot write the checkpoint ({err.strerror or err}); the disk may be "
                                   "full") from err
    for keep, d in zip(chunks or [], dirs):
        prune_chunks(d / REPLAY_DIR, keep)


def _checkpoint_path(out: Path, configs: Sequence[Mapping[str, Any]]) -> Path:
    """``OUT/populations/<key>.pkl``: one file per population (its members' configs make the key)."""
    key = hashlib.sha1(json.dumps([{k: v for k, v in c.items() if k not in OUTPUT_KEYS} for c in configs],
                                  sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Path(out) / "populations" / f"{key}.pkl"


#: what a member's run writes beside config.yaml, run.h5 and summary.json (the Q-network's weights), and what a
#: single run of ``agents.train dqn`` may have left in the folder (removed on a fresh start)
MEMBER_FILES = ("q_net.pt", "model.zip", CHECKPOINT, REPLAY_DIR)


def member_dirs(configs: Sequence[Mapping[str, Any]], out: str | Path) -> list[Path]:
    """Each member's run folder under ``out`` (the one ``agents.train ALGO`` would write its run to)."""
    command = get_command(configs[0].get("algo", "dqn"))
    return [command.run_dir(c, Path(out)) for c in configs]


def train_population(runs: Sequence[RunFolder], members: Sequence[Member], out: str | Path,
                     implementation: str = "auto", device: str = "cpu",
                     checkpoint_every: int | None = None) -> list[dict[str, Any]]:
    """Train ``members`` into their ``runs`` (:func:`member_configs` and :func:`member_dirs`, opened with
    :func:`agents.lifecycle.open_runs`: locked, ``resume`` set on all or none); their summaries.

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
    :class:`runlog.RunLogWriteError`) propagates. Sets the process's allocator for training
    (:func:`agents.allocator.retain_freed_memory`)."""
    retain_freed_memory()
    configs, resume = [run.config for run in runs], runs[0].resume
    if (why := _differences(configs)) is not None:
        raise ConfigError(why)
    dirs = [run.path for run in runs]
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
    elif not path.exists() and None not in (done := [run.finished(FINISHED) for run in runs]):
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
            if "CUDA" in str(err) and not torch.cuda.is_available():
                raise ConfigError(f"{path}: the population checkpoint holds CUDA tensors and this machine has no CUDA "
                                  "device; resume it on a machine with one") from None
            raise ConfigError(f"{path}: the population checkpoint is unreadable ({type(err).__name__}: {err}); "
                              "delete it to start the population afresh") from None
        if state.get("replay_chunks"):
            try:
                for buf, d, chunks in zip(state["pop"].replay, dirs, state["replay_chunks"]):
                    buf.place_frames(configs[0].get("frames_on", "host"))  # (this attempt's setting)
                    buf.load_frames(d / REPLAY_DIR, chunks)
            except OSError as err:
                raise ConfigError(f"{path}: {err}; delete the checkpoint to start the population afresh") from None
        print(f"{path}: resuming the population of {len(members)} at step {state['pop'].num_timesteps}",
              file=sys.stderr)
    for run in runs:  # a fresh population clears each folder (its log is replaced below); a resumed one writes its
        if state is None:  # members' ends again
            run.clear(MEMBER_FILES)
        else:
            run.continue_run(final=("q_net.pt",))
    try:
        pop = state["pop"] if state else _engine(configs, members, implementation, device)
    except ValueError as err:  # (an env or setting the engine does not take)
        raise ConfigError(str(err)) from None
    seen = state["seen"] if state else [0] * len(members)
    begun = int(pop.num_timesteps)  # (a resumed population's step at its checkpoint; else 0)
    logs = []
    try:
        for m, (c, d) in enumerate(zip(configs, dirs)):
            d.mkdir(parents=True, exist_ok=True)
            logs.append(MemberLog(pop, m, c, d / "run.h5", device, state["logs"][m] if state else None,
                                  extra_attrs={"engine": f"population:{pop.implementation}",
                                               "population_size": len(members)}))
            if state is None:  # (after its log: a start killed in between leaves no config.yaml beside another's log)
                runs[m].write_config()
        # for the grid runner and later resumes: which runs, and which of their logs, this checkpoint holds
        record_members(path, dirs, Path(out), [log.runner.log.log_id for log in logs])
    except BaseException:  # (the logs opened so far: their files and locks are not left to the process's end)
        for log in logs:
            log.close()
        raise
    # the TD loss and learning rate of the first update, of the first at or after each hundredth of the run, and of
    # the last (probes.sb3.ProbeCallback's cadence; updates every train_freq steps past learning_starts)
    loss_every, train_freq = max(1, steps // 100), int(configs[0].get("train_freq", 1))
    first_update = (int(configs[0]["learning_starts"]) // train_freq + 1) * train_freq
    eval_every, eval_episodes = configs[0].get("eval_every"), int(configs[0].get("eval_episodes", 5))
    start = time.perf_counter() - (state["wall"] if state else 0.0)
    stop: list[int] = []  # the stop signal, once one came: the population stops after the step it is in
    on_device = isinstance(pop, DevicePopulation)
    ended = [bool(d) for d in pop.diverged_at]  # members whose logs ended (diverged)
    probing = any(log.runner.probes for log in logs)  # (else no per-member work on the host in a step)
    next_eval = (pop.num_timesteps // eval_every + 1) * eval_every if eval_every else None

    def evaluate(t: int) -> None:
        """The members' evaluations due at step ``t`` (after the env step, after the probes: EvalCallback's place
        in a single run's callbacks), each on its own test games seeded as a single run's."""
        nonlocal next_eval
        if next_eval is None or t < next_eval:
            return
        games = pop.evaluate([c["seed"] + EVAL_SEED_OFFSET + t for c in configs], eval_episodes)
        for m, log in enumerate(logs):
            if not ended[m] and not pop.diverged_at[m]:
                for ret, length in games[m]:
                    log.scalar("eval_return", t, ret)
                    log.scalar("eval_length", t, length)
        next_eval = (t // eval_every + 1) * eval_every

    def flush() -> None:
        """Log the episodes the host has seen since the last call; end the logs of members that diverged."""
        for m, log in enumerate(logs):
            if ended[m]:
                continue
            end = int(pop.diverged_at[m]) or steps
            for step, ret, length in pop.episodes[m][seen[m]:]:
                if step <= end:
                    log.scalar("episode_return", step, ret)
                    log.scalar("episode_length", step, length)
            seen[m] = len(pop.episodes[m])
            if pop.diverged_at[m]:  # its loss was not finite at that step: the member's run ends there, as a run's
                at = int(pop.diverged_at[m])
                log.scalar("loss", at, float(pop.diverged_loss_at[m]) if on_device else float(pop.last_losses[m]))
                log.runner.log.end(at, "nan")
                ended[m] = True
                print(f"{dirs[m]}: the TD loss is not finite at step {at}; the member stopped there", file=sys.stderr)

    try:
        with handling(STOP_SIGNALS, lambda signum, frame: stop.append(signum)):
            while pop.num_timesteps < steps and not stop and not all(ended):  # (all ended: nothing to do)
                if every and pop.num_timesteps % every == 0 and pop.num_timesteps and state is None:
                    if on_device:
                        pop.read_back()
                        flush()
                    _checkpoint(path, pop, seen, logs, time.perf_counter() - start, dirs)
                state = None  # (a resumed run does not rewrite the checkpoint it started from)
                t = pop.num_timesteps + 1  # the step about to be taken
                loss_step = t >= first_update and t % train_freq == 0 and \
                    (t // loss_every > (t - train_freq) // loss_every or t in (first_update, steps))
                due = [log for m, log in enumerate(logs) if not ended[m] and log.runner.due(t)] if probing else []
                if on_device and due:  # (read back first: no probe of a member after it diverged)
                    pop.read_back()
                    flush()
                    due = [log for m, log in enumerate(logs) if not ended[m] and log.runner.due(t)]
                probes = (lambda: [log.probe(t) for log in due]) if due else None
                if next_eval is not None and t >= next_eval:
                    probes = (lambda probes=probes, t=t: (probes and probes(), evaluate(t)))
                pop.step(probes) if on_device else pop.step(before_store=probes)
                if on_device and (loss_step or t == steps):  # (read now: nothing of a member is logged after it
                    pop.read_back()  # diverged, and its last episodes are)
                if not on_device or pop._read_to == t:
                    flush()
                if loss_step:
                    losses = pop.last_losses.cpu().tolist()
                    for m, log in enumerate(logs):
                        if not ended[m]:
                            log.scalar("loss", t, losses[m])  # as probes.sb3 logs a run's updates
                            log.scalar("learning_rate", t, members[m].learning_rate)
        if on_device:
            pop.read_back()
            flush()
        ongoing = [log for m, log in enumerate(logs) if not ended[m]]
        if stop and pop.num_timesteps < steps:  # checkpoint the step just finished (nothing is lost), mark the
            _checkpoint(path, pop, seen, logs, time.perf_counter() - start, dirs)  # logs, exit as a stopped run does
            for log in ongoing:
                log.runner.log.end(pop.num_timesteps, "interrupted")
            print(f"{path}: stopped by signal {stop[0]} at step {pop.num_timesteps} of {steps}, checkpointed; "
                  "--resume continues", file=sys.stderr)
            raise SystemExit(128 + stop[0])
        for m, run in enumerate(runs):  # the weights on disk before the logs say how the runs ended
            # (cloned: a member's tensors are views of the population's, whose whole storage torch.save would write)
            state = {k: v.cpu().clone() for k, v in pop.member_state(m).items()}
            run.write("q_net.pt", lambda f, state=state: torch.save(state, f))
        for log in ongoing:
            log.runner.log.end(steps, "finished")
    except (RunLogWriteError, RunWriteError):
        for m, log in enumerate(logs):
            if not ended[m]:
                with contextlib.suppress(RunLogWriteError):  # the failure itself is being reported
                    log.runner.log.end(pop.num_timesteps, "write_error")
        raise
    finally:
        for log in logs:
            log.close()
    wall = time.perf_counter() - start
    summaries = []
    for m, (run, d) in enumerate(zip(runs, dirs)):
        end = int(pop.diverged_at[m]) or steps
        returns = [r for step, r, _ in pop.episodes[m] if step <= end]
        k = max(1, int(np.ceil(0.1 * len(returns)))) if returns else 0
        summary = {"status": "nan" if pop.diverged_at[m] else "finished", "steps": end, "episodes": len(returns),
                   "final_return": float(np.mean(returns[-k:])) if returns else None,
                   "steps_per_second": (steps - begun) / wall,
                   "population_steps_per_second": (steps - begun) * len(members) / wall, "wall_seconds": wall,
                   "resumed_from_step": begun, "run_dir": str(d), "engine": f"population:{pop.implementation}"}
        summaries.append(run.finish(summary))
    path.unlink(missing_ok=True)  # finished: the logs, weights and summaries hold it (until here it stays resumable)
    members_file(path).unlink(missing_ok=True)
    for d in dirs:  # (an Atari member's replay chunks: only the checkpoint needed them)
        shutil.rmtree(d / REPLAY_DIR, ignore_errors=True)
    return summaries


def _differences(configs: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the runs of ``configs`` cannot share a population (they differ beyond :meth:`DQNPopulation.group`), or
    None."""
    if len({POPULATION.group(c) for c in configs}) == 1:
        return None
    also = f" and, on Atari, their network ({', '.join(NETWORK_KEYS)})" if is_atari(configs[0]["env"]) else ""
    return f"population members may differ in {', '.join(MEMBER_KEYS)}{also} only"


def _engine(configs: Sequence[Mapping[str, Any]], members: Sequence[Member], implementation: str,
            device: str) -> Population | DevicePopulation | AtariPopulation | AtariGroups:
    """The engine of ``implementation`` for ``members`` of ``configs`` (one per member, or one for all): the device
    step for ``device`` / ``device-compiled``, else :class:`Population` (whose own implementations the others are);
    on Atari an :class:`AtariPopulation`, or :class:`AtariGroups` where the members' networks differ."""
    configs = [configs] * len(members) if isinstance(configs, Mapping) else list(configs)
    config = configs[0]
    if is_atari(config["env"]):
        if len({network_key(c) for c in configs}) > 1:
            return AtariGroups(configs, members, implementation=implementation, device=device)
        return AtariPopulation(config, members, implementation=implementation, device=device)
    if implementation in DEVICE_MODES:
        return DevicePopulation(config, members, device=device, compile=implementation == "device-compiled")
    return Population(config, members, implementation=implementation, device=device)


def run_population(values: Mapping[str, Any], members: Sequence[Member], out: str | Path,
                   implementation: str = "auto", device: str = "cpu", resume: bool = False,
                   checkpoint_every: int | None = None, algo: str = "dqn") -> list[dict[str, Any]]:
    """Train ``members`` on the config of ``values`` (flag values, as ``resolve`` takes them) into their run folders
    under ``out``, each locked meanwhile (:class:`agents.errors.RunFolderBusy` if another process writes into one);
    their summaries (:func:`train_population`)."""
    configs = member_configs(values, members, algo)
    with open_runs(member_dirs(configs, out), configs, resume=resume) as runs:
        return train_population(runs, members, out, implementation, device, checkpoint_every)


class DQNPopulation:
    """The population engine as ``agents.train dqn``'s and ``agents.train rainbow``'s (Rainbow: Atari ids on
    ale-vector) :class:`agents.commands.Population`: runs whose configs differ only in :data:`MEMBER_KEYS` train
    together (``--seeds``, grids with ``engine: population``); on Atari also runs that differ in their network
    (:data:`agents.population.atari_groups.NETWORK_KEYS`: one sub-population per network, one vector env)."""

    def group(self, config: Mapping[str, Any]) -> str:
        if is_atari(config["env"]):
            return shared_key(config)
        return json.dumps({k: v for k, v in config.items() if k not in (*MEMBER_KEYS, "derived")}, sort_keys=True,
                          default=str)

    def refusal(self, configs: Sequence[Mapping[str, Any]]) -> str | None:
        if (why := _differences(configs)) is not None:
            return why
        if is_atari(configs[0]["env"]) or configs[0].get("algo") == "rainbow":
            if _implementation(configs[0]) in DEVICE_MODES:
                return (f"population_engine: {configs[0]['population_engine']} is the classic tasks' device step; "
                        "Atari populations take auto or exact")
            networks = {network_key(c): c for c in configs}.values()
            return next((why for c in networks if (why := atari_refusal(c, _device(c), _implementation(c)))), None)
        if _implementation(configs[0]) in DEVICE_MODES:
            return device_refusal(configs[0], _device(configs[0]))
        return config_refusal(configs[0], _device(configs[0]))

    def train(self, runs: Sequence[RunFolder], out: Path) -> list[dict[str, Any]]:
        threads = runs[0].config.get("torch_threads")
        torch.set_num_threads(1 if threads is None else int(threads))  # (small networks: one thread is fastest)
        members = [Member(*(run.config[k] for k in MEMBER_KEYS)) for run in runs]
        return train_population(runs, members, out, implementation=_implementation(runs[0].config),
                                device=_device(runs[0].config))

    def checkpointed(self, out: Path) -> list[list[Path]]:
        return checkpointed_groups(out)

    def capacity(self, configs: Sequence[Mapping[str, Any]], at_once: int = 1) -> int:
        """The most runs like these one population should hold on their device while ``at_once`` populations share
        the machine (:func:`memory.capacity`)."""
        return memory.capacity(configs, _device(configs[0]), at_once)

    def memory_bytes(self, configs: Sequence[Mapping[str, Any]]) -> int:
        """The population's estimated bytes on its device (:func:`memory.population_bytes`; an Atari population on
        CUDA: its networks, optimiser states and activations, its replays being on the host)."""
        if is_atari(configs[0]["env"]) and torch.device(_device(configs[0])).type == "cuda":
            return len(configs) * max(memory.atari_member_bytes(c)[1] for c in configs)
        return memory.population_bytes(configs)

    def host_bytes(self, configs: Sequence[Mapping[str, Any]]) -> int | None:
        """An Atari population's frame replays in host memory (every member's at the largest buffer), else None."""
        if not is_atari(configs[0]["env"]):
            return None
        largest = max(int(c["buffer_size"]) for c in configs)
        return len(configs) * max(memory.atari_member_bytes(c, largest)[0] for c in configs)

    def describe(self, configs: Sequence[Mapping[str, Any]]) -> str:
        """The population's estimated memory and device, for a grid's plan."""
        host = self.host_bytes(configs) if torch.device(_device(configs[0])).type == "cuda" else None
        return f"{self.memory_bytes(configs) / 2**30:.2f} GiB on {_device(configs[0])}" + \
            (f" and {host / 2**30:.2f} GiB of host memory" if host else "")

    def seconds(self, configs: Sequence[Mapping[str, Any]]) -> float | None:
        """Estimated seconds of the population's training, its step timed here (:mod:`agents.population.timing`);
        None for a CUDA device this machine lacks."""
        device = _device(configs[0])
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            return None
        members = [Member(*(c[k] for k in MEMBER_KEYS)) for c in configs]
        return timing.population_seconds(configs, members, _implementation(configs[0]), device)


def _implementation(config: Mapping[str, Any]) -> str:
    """The implementation the config's ``population_engine`` names: the device step's modes as they are; ``exact``
    and ``auto`` (unset), the population engine's own ``auto`` (the same engine on every device: the device step
    draws differently, so it is only taken where the config names it, and its runs are named by it); for Atari,
    ``exact`` is ``loop``, where a member is its single run bit for bit on any device."""
    engine = config.get("population_engine", "auto")
    if engine == "exact" and is_atari(str(config.get("env"))):
        return "loop"
    return engine if engine in DEVICE_MODES else "auto"


def _device(config: Mapping[str, Any]) -> str:
    """The config's device (``auto``: CUDA where there is one)."""
    device = config.get("device", "cpu")
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


#: ``agents.train dqn``'s population engine (:attr:`agents.rl.algos.RLAlgo.population`)
POPULATION = DQNPopulation()
