"""Run a grid of configurations: expand it, skip finished runs, execute the rest in parallel.

    python -m agents.grid GRID.yml --out DIR [--workers N] [--backend local|ray] [--resume] [--dry-run] \\
        [--axis KEY=VALUES ...]

A grid file (YAML) names a command of ``agents.train``, optionally plugin modules to import (:mod:`probes.plugins`),
and one or more sub-grids whose lists are crossed::

    command: stream-sin
    import: [my_plugin]   # optional
    fixed: {steps: 200}
    grids:
      - {act: [elephant, relu], lr: [0.001, 0.0001], seed: [0, 1, 2, 3, 4]}
      - {act: [relu], srnn_lambda: [0.1, 0.01], srnn_beta: [0.05, 0.1], lr: [0.001], seed: [0, 1, 2, 3, 4]}

Every entry is validated by the command before anything runs, and each run goes through the same run-folder
lifecycle as on the command line (:mod:`agents.lifecycle`). A run is finished when its run directory holds
``DONE.json`` (written last, with the run's summary) and its saved config (``config.yaml``, or the config in
``DONE.json`` for folders written without one) equals the grid's config for it, ignoring the keys that only change
how a run reports and saves (:data:`agents.runfolder.OUTPUT_KEYS`); a run finished or begun with another config
(its ``config.yaml`` differs) is stale and is redone afresh, never resumed. An interrupted grid re-run skips
finished runs and redoes the rest; with ``--resume`` it continues unfinished runs of commands that checkpoint (dqn,
ppo, sac) from their last checkpoint, exactly as if they had not stopped.

Ctrl-C starts no more runs; the running ones get the signal too (they share the terminal's process group) and
stop cleanly; the grid then prints what finished, was interrupted or was not started and exits with status 130.
SIGTERM does the same (exit status 143). With ``--workers`` 2 or more, a signal sent to the grid process alone
(``kill -INT PID``) lets the running runs finish. A run that fails is reported (its traceback goes to
``ERROR.txt`` in its run directory) and the others go on; the grid then exits with status 1.

``engine: population`` (commands with a population engine, :class:`agents.commands.Population`: ``dqn``;
optionally ``population_size: N``, the most members per population, or ``auto``: as many as the engine's capacity
on the device, for dqn what its memory holds and on a CPU at most 64) trains the runs its engine groups together
(for dqn: runs that differ only in seed, learning rate, buffer size and epsilon schedule, and on Atari also in
their activation: sub-populations per network, :mod:`agents.population.atari_groups`) together, in as few
populations as that allows, of sizes differing by at most one, each in one process: each member's run folder is the one the run would have alone, with the same ``DONE.json``; a
population stopped or killed continues from its checkpoint with ``--resume``.

The local backend is a process pool with one torch thread per worker; ``--backend ray`` runs the same tasks (a run,
or a population) on a Ray cluster, one CPU and one torch thread each (tasks on CUDA also a share of a GPU): the cluster at ``RAY_ADDRESS``, else a local
one; as many at a time as the cluster has CPUs, or ``--workers``. Ray never retries a task (``--resume`` continues
what a dead worker left); a stop signal cancels the running tasks, which stop cleanly as on Ctrl-C.
"""

from .cli import main
from .drive import Outcome
from .planning import GridRun, PopulationEngine, PopulationTask, plan, tasks
from .ray_backend import WorkerLost
from .run import GridReport, run_grid
from .spec import expand, load_grid
from .worker import execute, execute_population

__all__ = ["GridRun", "PopulationEngine", "PopulationTask", "WorkerLost", "Outcome", "GridReport", "expand",
           "load_grid", "plan", "tasks", "execute", "execute_population", "run_grid", "main"]
