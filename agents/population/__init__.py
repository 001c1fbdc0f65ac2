"""The population engine: many value-based agents trained in lockstep in one process.

* :mod:`agents.population.envs`: classic-control tasks stepped as arrays, equal to the Gymnasium envs step for step;
* :mod:`agents.population.engine`: P paper-DQN members with stacked parameters, per-member learning rates, buffers,
  epsilon schedules and randomness; a member equals ``agents.train dqn``'s SB3 model bit for bit
  (``implementation="loop"``);
* :mod:`agents.population.networks`: the members' networks on stacked parameters, run in one call per step
  (:data:`agents.population.networks.IMPLEMENTATIONS`), their TD losses and the RMSprop step;
* :mod:`agents.population.run`: a population written as one run folder per member, as `agents.train dqn` writes;
* :mod:`agents.population.bench`: aggregate env steps/s against SB3's DQN, with the time split.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

#: what population members may differ in (dqn config keys; the fields of :class:`agents.population.engine.Member`, in
#: order); declared here so that the grid runner reads it without importing the engine
MEMBER_KEYS = ("seed", "learning_rate", "buffer_size", "exploration_initial_eps", "exploration_final_eps",
               "exploration_steps")


def members_file(checkpoint: Path) -> Path:
    """The file beside a population checkpoint (``OUT/populations/<key>.pkl``) that lists its members' run folders."""
    return checkpoint.with_suffix(".members.json")


def record_members(checkpoint: Path, dirs: Sequence[Path], out: Path,
                   log_ids: Sequence[str | None] | None = None) -> None:
    """List the members' run folders (relative to ``out``, in member order) beside ``checkpoint``, atomically, with
    the ids of their run logs (:attr:`runlog.RunLog.log_id`) where given: the logs the checkpoint continues."""
    tmp = members_file(checkpoint).with_suffix(".tmp")
    listing: dict = {"members": [Path(d).relative_to(out).as_posix() for d in dirs]}
    if log_ids is not None:
        listing["logs"] = list(log_ids)
    try:
        tmp.write_text(json.dumps(listing))
        os.replace(tmp, members_file(checkpoint))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def checkpointed_groups(out: Path) -> list[list[Path]]:
    """The member run folders of each population under ``out`` that has a checkpoint, newest checkpoint first: the
    grid runner groups ``--resume`` tasks by them, so that a population continues its checkpoint even where the
    grid's chunks have moved since (a seed or learning rate added, a run finished elsewhere); stale ones
    (:func:`restarted_since`) are left out."""
    groups = []
    for listing in (Path(out) / "populations").glob("*.members.json"):
        checkpoint = listing.with_name(listing.name.removesuffix(".members.json") + ".pkl")
        try:
            written = checkpoint.stat().st_mtime
            dirs = [Path(out) / d for d in json.loads(listing.read_text())["members"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # no checkpoint (finished or never written) or an unreadable list: the grid's own chunks
        if restarted_since(checkpoint, dirs) is None:
            groups.append((written, dirs))
    return [dirs for _, dirs in sorted(groups, key=lambda g: -g[0])]


def restarted_since(checkpoint: Path, dirs: Sequence[Path]) -> Path | None:
    """The first member folder in which a run started afresh after ``checkpoint`` was written, else None: such a
    checkpoint is stale, its members' logs are another run's. Where the members list beside it records a member's
    log id, a folder whose ``run.h5`` has another id, is gone or is unreadable (every fresh start, population or
    single run, makes a new log, and one killed while creating it leaves a broken file; a log the checkpoint could
    not resume from anyway; checked in a child process first, as HDF5 can hang on corrupt metadata), whatever the
    file times, so a study copied without them resumes; where it records none (a list from before ids, a log from
    before ids: resuming gives it one), a folder whose ``config.yaml`` (which only a fresh start writes) is newer
    than the checkpoint."""
    from runlog import RunLogError, check_logs, read_log_id

    try:
        listing = json.loads(members_file(checkpoint).read_text())
        out = checkpoint.parent.parent  # (OUT/populations/<key>.pkl)
        ids = {out / d: i for d, i in zip(listing["members"], listing.get("logs", []))}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        ids = {}
    written = checkpoint.stat().st_mtime
    logs = [d / "run.h5" for d in map(Path, dirs) if isinstance(ids.get(d), str) and (d / "run.h5").exists()]
    unreadable = {path for path, why in check_logs(logs).items() if why} if logs else set()
    for d in map(Path, dirs):
        if isinstance(recorded := ids.get(d), str):
            if os.fspath(d / "run.h5") in unreadable:
                return d
            try:
                if read_log_id(d / "run.h5", timeout_s=None) != recorded:  # (checked above)
                    return d
                continue
            except (FileNotFoundError, RunLogError, OSError, RuntimeError):
                return d
        try:
            if (d / "config.yaml").stat().st_mtime > written:
                return d
        except OSError:
            continue
    return None
