"""Build an SB3 agent from a resolved config and train it into a run directory.

A run directory holds ``config.yaml`` (the resolved config, written first), ``run.h5`` (the
:class:`probes.sb3.ProbeCallback` log: probes, episode returns and lengths, losses; always written),
``model.zip`` (``model.save``; load with the algorithm's class, ``agents.rl.algos.ALGOS[name].model.load``),
``summary.json``, ``DONE.json`` (:mod:`agents.lifecycle`) and, until the run finishes, ``checkpoint.pkl``
(:mod:`agents.rl.checkpoint`; with a frame buffer also ``replay/``, its frames in chunks).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import CallbackList
from stable_baselines3.common.logger import Logger, configure
from stable_baselines3.common.utils import LinearSchedule
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from agents.allocator import retain_freed_memory
from agents.errors import ConfigError, RunWriteError
from agents.lifecycle import RunFolder, open_runs
from agents.runfolder import OUTPUT_KEYS
from interference.nets import count_parameters
from probes import make_probe
from runlog import RunLogWriteError
from probes.sb3 import ProbeCallback

from .algos import ALGOS
from .budget import CALIBRATE_ABOVE, Estimate, available_memory, busy, calibrate, check_memory, fmt_bytes, rss
from .callbacks import ESTIMATE_AFTER_S, RunCallback, duration, final_return, finish_time, stop_on_signals
from .checkpoint import (CHECKPOINT, REPLAY_DIR, CheckpointError, Checkpointer, check_picklable, read_checkpoint,
                         restore_model)
from .config import algo_kwargs, probe_arguments
from .envs import is_atari, make_env
from .evaluation import EvalCallback
from .policies import ActMinAtarCNN, ActNatureCNN
from .settings import OPTIMIZERS

__all__ = ["build_env", "build_model", "online_parameters", "train", "train_run", "checkpoint_every", "RUN_FILES",
           "CHECKPOINT_FILES"]


def build_env(config: Mapping[str, Any], seed: int | None = None) -> VecEnv:
    """The training ``VecEnv`` of a resolved config (wrapped in SB3's ``VecNormalize`` when it normalises
    observations or rewards; its statistics travel with the env into checkpoints)."""
    env = make_env(config["env"], n_envs=config.get("n_envs", 1), seed=config["seed"] if seed is None else seed,
                   env_kwargs=config.get("env_kwargs"), max_episode_steps=config.get("max_episode_steps"),
                   frame_stack=config.get("frame_stack", 4), atari_wrapper_kwargs=config.get("atari_wrapper_kwargs"),
                   atari_env=config.get("atari_env", "sb3"))
    obs, reward = bool(config.get("normalize_obs")), bool(config.get("normalize_reward"))
    if obs or reward:
        env = VecNormalize(env, norm_obs=obs, norm_reward=reward, gamma=config.get("gamma", 0.99))
    return env


def build_eval_env(config: Mapping[str, Any], seed: int) -> VecEnv:
    """The evaluation env of a resolved config: the training env's settings, one env, and for Atari no episodic
    life and no reward clipping (whole games, real scores: the authors' test envs)."""
    wrapper = dict(config.get("atari_wrapper_kwargs") or {})
    if is_atari(config["env"]):
        wrapper.update(terminal_on_life_loss=False, clip_reward=False)
    return make_env(config["env"], n_envs=1, seed=seed, env_kwargs=config.get("env_kwargs"),
                    max_episode_steps=config.get("max_episode_steps"), frame_stack=config.get("frame_stack", 4),
                    atari_wrapper_kwargs=wrapper, atari_env=config.get("atari_env", "sb3"), evaluation=True)


def policy_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    """SB3 ``policy_kwargs`` of a resolved config (activation, widths, optimizer, features extractor)."""
    derived = config["derived"]
    spec = {"activation": config["act"], "act_kwargs": dict(config["act_kwargs"]),
            "layer_norm": config["layer_norm"], "sigma_bias": config["sigma_bias"]}
    if "act_layers" in config:  # (PPO and SAC)
        spec["act_layers"] = config["act_layers"]
    kwargs: dict[str, Any] = {**dict(config.get("policy_kwargs") or {}), **spec,
                              "optimizer_class": OPTIMIZERS[config["optimizer"]],
                              "optimizer_kwargs": dict(config["optimizer_kwargs"])}
    if derived["cnn"]:
        kwargs["features_extractor_class"] = ActMinAtarCNN if derived.get("trunk") == "minatar" else ActNatureCNN
        kwargs["features_extractor_kwargs"] = {"features_dim": derived["features"], **spec}
    hidden = derived["hidden"]
    kwargs["net_arch"] = next(iter(hidden.values())) if len(hidden) == 1 else dict(hidden)  # one role: a list
    network = ALGOS[config["algo"]].network
    return kwargs if network is None else network(config, kwargs)


def build_model(config: Mapping[str, Any], env: VecEnv | None = None) -> BaseAlgorithm:
    """The SB3 algorithm of a resolved config (``env`` defaults to :func:`build_env`).

    Its logger keeps the latest values in memory (``logger.name_to_value``, which the run log reads) and writes
    nothing: SB3's default logger would create an empty ``SB3-<date>`` folder in the temp directory per ``learn``.
    """
    spec = ALGOS[config["algo"]]
    lr = config["learning_rate"]
    schedule = LinearSchedule(lr, 0.0, 1.0) if config.get("lr_schedule") == "linear" else lr
    model = spec.model(spec.policy, build_env(config) if env is None else env, learning_rate=schedule,
                       policy_kwargs=policy_kwargs(config), seed=config["seed"], device=config["device"],
                       verbose=0, **algo_kwargs(config))
    model.set_logger(Logger(folder=None, output_formats=[]))
    return model


def online_parameters(model: BaseAlgorithm, algo: str) -> int:
    """Trainable parameters of the networks algorithm ``algo`` trains (targets excluded)."""
    return sum(count_parameters(net) for net in ALGOS[algo].online(model))


def _diverged(model: BaseAlgorithm, algo: str, run_cb: RunCallback, err: Exception) -> bool:
    """Whether ``err`` (raised inside SB3) means the run diverged: non-finite parameters, or a torch distribution
    refusing non-finite outputs of the policy (huge but finite weights overflow in the forward pass); if so the run
    ends as diverged, like a non-finite loss."""
    bad = [name for net in ALGOS[algo].online(model) for name, p in net.named_parameters()
           if not torch.isfinite(p).all()]
    refused = isinstance(err, ValueError) and "found invalid values" in str(err)
    if not bad and not refused:
        return False
    what = (f"the network's parameters became non-finite ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})"
            if bad else "the network's outputs became non-finite")
    first = (str(err).strip().splitlines() or [type(err).__name__])[0].split(" of distribution")[0][:120]
    run_cb.stop_reason = "nan"
    run_cb.stop_message = (f"{what} by step {model.num_timesteps} (SB3 stopped with {type(err).__name__}: {first}); "
                           f"stopping the run (try a smaller learning rate)")
    return True


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


#: what a run writes beside config.yaml and summary.json (its checkpoint files apart: :data:`CHECKPOINT_FILES`)
RUN_FILES = ("run.h5", "model.zip")
#: the checkpoint and its replay chunks, removed once the run ended
CHECKPOINT_FILES = (CHECKPOINT, REPLAY_DIR)


def _start(run: RunFolder, before_load: Callable[[], None] | None = None) -> tuple[dict[str, Any] | None, dict | None]:
    """Start ``run``: ``(checkpoint to resume from or None, summary of a run already finished or None)``.

    Without ``run.resume`` the files of an earlier run are replaced; with it, a checkpoint is continued (the end of
    the earlier attempt is removed; ``before_load`` is called before it is read), a run finished with this config is
    left as it is, and a run without a checkpoint starts afresh.
    """
    if run.resume:
        summary = run.finished()
        if summary is not None:
            print(f"{run.path}: the run finished already ({summary['steps']} steps); nothing to resume",
                  file=sys.stderr)
            run.remove(*CHECKPOINT_FILES)
            return None, summary
        if before_load is not None and (run.path / CHECKPOINT).exists():
            before_load()
        state = read_checkpoint(run.path, run.config)
        if state is not None:
            run.continue_run(final=("model.zip",))
            print(f"{run.path}: resuming at step {state['step']} from {CHECKPOINT}", file=sys.stderr)
            return state, None
        print(f"{run.path}: no checkpoint to resume from; starting at step 0", file=sys.stderr)
    run.start(RUN_FILES, checkpoint=CHECKPOINT_FILES)
    return None, None


def checkpoint_every(config: Mapping[str, Any]) -> int:
    """Env steps between checkpoints: the config's ``checkpoint_every`` (0: none), by default a tenth of the run."""
    every = config.get("checkpoint_every")
    return max(1, config["n_timesteps"] // 10) if every is None else int(every)


def _plan(config: Mapping[str, Any], model: BaseAlgorithm, replay: int, peak: int) -> tuple[str, Estimate | None]:
    """What the run will do and hold: env steps to go (and for long Q-learning runs updates and the first estimate
    of the duration on this machine, :func:`agents.rl.budget.calibrate`), the replay buffer's memory and the peak
    memory (:mod:`agents.rl.budget`); and the duration model, which the run measures again once it trains."""
    steps, done = config["n_timesteps"], int(model.num_timesteps)
    text = f"{steps:,} env steps" + (f" ({steps - done:,} to go)" if done else "")
    estimate = None
    if steps - done > CALIBRATE_ABOVE:
        try:
            estimate = calibrate(config, model, lambda: build_env(config, seed=config["seed"] + 7919))
        except Exception as err:  # noqa: BLE001 - an estimate is no reason not to train
            print(f"note: no duration estimate ({type(err).__name__}: {err})", file=sys.stderr)
    if estimate is not None:
        seconds, load = estimate.seconds(done), busy()
        text += (f", {estimate.updates(done):,} updates: first estimate about {duration(seconds)} on this machine, "
                 f"done around {finish_time(seconds)} (from a {estimate.calibration_s:.1f} s calibration"
                 + (f" while the machine was busy, {load}" if load else "")
                 + f"; probes, evaluations and checkpoints extra; measured again after {ESTIMATE_AFTER_S:.0f} s of "
                   "training)")
    if replay:
        text += f"; replay buffer of {config['buffer_size']:,} transitions: {fmt_bytes(replay)}"
    text += f"; peak memory about {fmt_bytes(peak)} of {fmt_bytes(available_memory() + rss())}"
    return text, estimate


def _summary(status: str, model: BaseAlgorithm, algo: str, run_cb: RunCallback, run_dir: Path,
             checkpointer: Checkpointer | None, evaluation: EvalCallback | None) -> dict[str, Any]:
    """The run's ``summary.json``."""
    wall = run_cb.wall_seconds
    summary = {
        "status": status,
        "steps": int(model.num_timesteps),
        "episodes": len(run_cb.returns),
        "final_return": _finite_or_none(final_return(run_cb.returns)),  # None without episodes (JSON has no NaN)
        "steps_per_second": _finite_or_none(model.num_timesteps / wall if wall > 0 else math.nan),
        "wall_seconds": wall,
        "parameters": online_parameters(model, algo),
        "run_dir": str(run_dir),
    }
    if evaluation is not None and evaluation.last is not None:  # (the run log has every evaluation)
        summary["last_eval"] = {"step": evaluation.last[0], "mean_return": evaluation.last[1]}
    if checkpointer is not None:
        saved = checkpointer.saved
        summary["checkpoints"] = {"written": len(saved), "bytes": saved[-1][1] if saved else None,
                                  "seconds": sum(t for _, _, t in saved)}
    return summary


def train(config: Mapping[str, Any], run_dir: str | Path, resume: bool = False) -> dict[str, Any]:
    """Train the agent of ``config`` into ``run_dir`` (locked meanwhile: :func:`agents.lifecycle.open_runs`); returns
    the run's summary (:func:`train_run`)."""
    with open_runs([Path(run_dir)], [config], resume=resume) as [run]:
        return train_run(run)


def train_run(run: RunFolder) -> dict[str, Any]:
    """Train the agent of ``run.config`` into the run's folder; returns the run's summary.

    Ctrl-C (or SIGTERM) stops at the next rollout start with a checkpoint (without checkpoints: after the current
    step), saves the model and the log, then exits with status 130 (143). A non-finite loss stops the run with a
    message on stderr; the summary's ``status`` is then ``"nan"``. ``resume`` continues the run from its checkpoint
    (:mod:`agents.rl.checkpoint`) exactly as if it had not stopped. Sets the process's allocator for training
    (:func:`agents.allocator.retain_freed_memory`).
    """
    retain_freed_memory()
    config, run_dir = run.config, run.path
    if config.get("population_engine", "auto") not in ("auto", "exact"):
        raise ConfigError(f"population_engine={config['population_engine']} is for populations (dqn --seeds or a grid "
                          "with engine: population that the population engine takes); a single run trains with SB3")
    planned: list[tuple[int, int]] = []  # a resumed run's (replay, peak), checked before its checkpoint is read

    def check_resumed_memory() -> None:
        if "buffer_size" in config:
            probe_env = build_env(config)  # (only its spaces: the replay buffer the checkpoint holds)
            try:
                planned.append(check_memory(config, probe_env, resume=True))
            finally:
                probe_env.close()

    state, finished = _start(run, before_load=check_resumed_memory)
    if finished is not None:
        return finished

    threads = config.get("torch_threads")
    if threads is None and not config["derived"]["cnn"]:
        threads = 1  # small networks: one thread is fastest and leaves cores to other runs
    if threads is not None:
        torch.set_num_threads(threads)

    import multiprocessing

    alone = multiprocessing.parent_process() is None  # not a grid worker, whose output is the grid's
    progress = config.get("progress")
    if progress is None:
        progress = sys.stderr.isatty() and alone
    starts = config.get("learning_starts")
    if starts is not None and config["n_timesteps"] <= starts and state is None:
        print(f"note: learning_starts={starts} >= steps={config['n_timesteps']}: no gradient update will run",
              file=sys.stderr)
    every = checkpoint_every(config)
    if state is None:
        env = build_env(config)
        if every:
            try:
                check_picklable(env, config["env"])
            except CheckpointError:
                if config.get("checkpoint_every") is not None:
                    raise
                print(f"note: {config['env']} runs without checkpoints (its environment does not pickle); --resume "
                      "would start it afresh", file=sys.stderr)
                every = 0
        replay, peak = check_memory(config, env)  # refuses a buffer that does not fit, before allocating it
        model = build_model(config, env)
    else:
        model = restore_model(state, config, run_dir)
        env = model.get_env()
        replay, peak = planned[0] if planned else (0, rss())  # (the peak counts the whole buffer, as a new run's)
        peak = max(peak, rss())
    sb3_log = config.get("sb3_log") or []
    if sb3_log:  # SB3's own outputs (CSV, TensorBoard, ...), dumped by learn every episode / rollout
        model.set_logger(configure(str(run_dir / "sb3"), sb3_log))
    probes = [make_probe(name, **probe_arguments(config, name)) for name in config["probe"]]
    for probe in probes:
        if state is None and (late := [a for a in probe.at if a > config["n_timesteps"]]):
            print(f"note: probe {probe.name} at steps {late} will not run in {config['n_timesteps']:,} steps "
                  "(--scale-probe-at scales its chosen steps to the run)", file=sys.stderr)
        if state is None and probe.every is None and not probe.at:
            print(f"note: probe {probe.name} will not run: probe_every is 0 and it has no chosen steps (at); set "
                  "--probe-every N", file=sys.stderr)
    # the log's config: what the run computes (torch_threads stays, as in logs written before OUTPUT_KEYS)
    log_config = {k: v for k, v in config.items() if k == "torch_threads" or k not in OUTPUT_KEYS}
    steps = config["n_timesteps"]
    desc = f"{config['algo']} {config['env']} {config['act']} seed {config['seed']}"
    estimate = None
    if alone:
        plan, estimate = _plan(config, model, replay, peak)
        print(f"{desc}: {plan}", file=sys.stderr, flush=True)
    run_cb = RunCallback(steps, progress=progress, lines=alone, resume=None if state is None else state["run"],
                         desc=desc, estimate=estimate)
    probe_cb = ProbeCallback(probes, run_dir / "run.h5", config=log_config, seed=config["seed"],
                             n_inputs=config["probe_inputs"], loss_every=max(1, steps // 100),
                             end_status=lambda: run_cb.stop_reason or "finished",
                             context=ALGOS[config["algo"]].probe_context,
                             resume=None if state is None else state["probes"], finish_at_training_end=False)
    callbacks = [run_cb, probe_cb]
    if config.get("eval_every"):
        callbacks.append(EvalCallback(lambda s: build_eval_env(config, s), config["eval_every"],
                                      config.get("eval_episodes", 5), config["seed"], probe_cb))
    if every:
        callbacks.append(Checkpointer(run_dir, every, config=log_config, run_cb=run_cb, probe_cb=probe_cb,
                                      resume=state))
    # signals are handled until the run's files are complete: a stop after training ends changes nothing
    with stop_on_signals(run_cb):
        ended: bool | str = False  # whether the run ended in a way run_end can say (finished, interrupted, diverged)
        try:
            try:
                model.learn(steps - model.num_timesteps, callback=CallbackList(callbacks),
                            log_interval=1 if sb3_log else None, reset_num_timesteps=state is None)
            except (ValueError, RuntimeError) as err:
                if not _diverged(model, config["algo"], run_cb, err):
                    raise
                run_cb.on_training_end()  # SB3 skipped it: the wall time and the bar
            run.write("model.zip", model.save)  # on disk before the log says how the run ended
            ended = True
        except (RunLogWriteError, RunWriteError):
            ended = "write_error"
            raise
        finally:
            # the log is closed readable, with run_end once model.zip is on disk (finished, interrupted, diverged) or
            # for a failed write (a crash leaves none: the run did not finish, and readers treat a log without
            # run_end so)
            probe_cb.finish(end=ended)
            if run_cb.bar is not None:
                run_cb.bar.close()
        env.close()

        status = run_cb.stop_reason or "finished"
        summary = _summary(status, model, config["algo"], run_cb, run_dir, callbacks[-1] if every else None,
                           next((cb for cb in callbacks if isinstance(cb, EvalCallback)), None))
        # (a run that ended, finished or diverged, drops its checkpoint: model.zip and the log hold it, and a resumed
        # diverged run would diverge again)
        run.finish(summary, checkpoint=CHECKPOINT_FILES)
    if status == "interrupted":
        where = (f"; continue it with --resume (checkpoint at step {callbacks[-1].last_step})"
                 if every and callbacks[-1].last_step is not None else "")
        print(f"{run_cb.stop_message}; model and log saved in {run_dir}{where}", file=sys.stderr)
        raise SystemExit(128 + run_cb.stop_signal)  # the shell's convention: 130 for Ctrl-C, 143 for SIGTERM
    if status == "nan":
        print(f"error: {run_cb.stop_message}; the log and model so far are in {run_dir}", file=sys.stderr)
    return summary
