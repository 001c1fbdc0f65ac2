"""Run a grid of configurations: expand it, skip finished runs, execute the rest in parallel.

    python -m agents.grid GRID.yml --out DIR [--workers N] [--backend local|ray] [--dry-run]

A grid file (YAML) names a command of ``agents.train`` and one or more sub-grids whose lists are crossed::

    command: stream-sin
    fixed: {steps: 200}
    grids:
      - {act: [elephant, relu], lr: [0.001, 0.0001], seed: [0, 1, 2, 3, 4]}
      - {act: [relu], srnn_lambda: [0.1, 0.01], srnn_beta: [0.05, 0.1], lr: [0.001], seed: [0, 1, 2, 3, 4]}

Every entry is validated by the command before anything runs. A run is finished when its run directory holds
``DONE.json`` (written last, with the run's summary); an interrupted grid re-run skips finished runs and redoes the
rest. The local backend is a process pool with one torch thread per worker; ``--backend ray`` submits the same
function to a Ray cluster (``pip install -e .[ray]``; connect with ``RAY_ADDRESS``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .commands import ConfigError, get_command, read_yaml

__all__ = ["GridRun", "expand", "load_grid", "plan", "run_grid", "main"]

DONE = "DONE.json"


@dataclass(frozen=True)
class GridRun:
    command: str
    config: dict[str, Any]
    run_dir: Path

    @property
    def done(self) -> bool:
        return (self.run_dir / DONE).exists()


def expand(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """All configurations of a grid spec (``fixed`` merged into the cross product of each sub-grid's lists)."""
    if not isinstance(spec, Mapping) or "command" not in spec:
        raise ConfigError("a grid needs a 'command' (e.g. command: stream-sin) and 'grids' (a list of mappings)")
    unknown = set(spec) - {"command", "fixed", "grids"}
    if unknown:
        raise ConfigError(f"unknown grid keys {sorted(unknown)}; allowed: command, fixed, grids")
    fixed = spec.get("fixed") or {}
    grids = spec.get("grids") or [{}]
    if not isinstance(fixed, Mapping) or not isinstance(grids, list) or not all(isinstance(g, Mapping) for g in grids):
        raise ConfigError("'fixed' must be a mapping and 'grids' a list of mappings of lists")
    out = []
    for grid in grids:
        keys = list(grid)
        values = [v if isinstance(v, list) else [v] for v in grid.values()]
        for combo in itertools.product(*values):
            out.append({**fixed, **dict(zip(keys, combo))})
    return out


def load_grid(path: str | Path) -> dict[str, Any]:
    """Read a YAML grid file, with errors that name the file."""
    spec = read_yaml(path, "grid")
    if not isinstance(spec, dict):
        raise ConfigError(f"grid file {path} must hold a mapping with 'command' and 'grids'")
    return spec


def plan(spec: Mapping[str, Any], out: str | Path) -> list[GridRun]:
    """Validate every configuration and place it in its run directory under ``out``."""
    cmd = get_command(str(spec.get("command")))
    runs, seen = [], set()
    for i, entry in enumerate(expand(spec)):
        try:
            config = cmd.make_config(entry)
        except ConfigError as err:
            raise ConfigError(f"grid entry {i} {entry}: {err}") from None
        run_dir = cmd.run_dir(config, Path(out))
        if run_dir in seen:
            raise ConfigError(f"grid entry {i} {entry} duplicates the run directory {run_dir}")
        seen.add(run_dir)
        runs.append(GridRun(cmd.name, config, run_dir))
    return runs


def execute(run: GridRun) -> dict[str, Any]:
    """Run one configuration and mark it finished (the function workers and Ray tasks call)."""
    import torch

    torch.set_num_threads(1)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    summary = get_command(run.command).run(run.config, run.run_dir)
    tmp = run.run_dir / (DONE + ".tmp")
    tmp.write_text(json.dumps({"config": run.config, "summary": summary}, indent=1, default=str))
    tmp.replace(run.run_dir / DONE)
    return summary


def run_grid(runs: Sequence[GridRun], *, workers: int = 1, backend: str = "local",
             progress: bool = True) -> list[tuple[GridRun, dict[str, Any]]]:
    """Execute the unfinished runs; returns ``(run, summary)`` for the runs executed now."""
    todo = [r for r in runs if not r.done]
    if backend == "ray":
        return _run_ray(todo, progress)
    if backend != "local":
        raise ConfigError(f"unknown backend {backend!r}; choose local or ray")
    results = []
    bar = tqdm(total=len(todo), desc="runs", disable=not progress)
    if workers <= 1:
        for r in todo:
            results.append((r, execute(r)))
            bar.update()
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(execute, r): r for r in todo}
            for fut in as_completed(futures):
                results.append((futures[fut], fut.result()))
                bar.update()
    bar.close()
    return results


def _run_ray(todo: Sequence[GridRun], progress: bool) -> list[tuple[GridRun, dict[str, Any]]]:
    try:
        import ray
    except ImportError:
        raise ConfigError("the ray backend needs Ray: pip install -e '.[ray]'") from None
    ray.init(ignore_reinit_error=True)
    task = ray.remote(num_cpus=1)(execute)
    refs = {task.remote(r): r for r in todo}
    results = []
    with tqdm(total=len(refs), desc="runs", disable=not progress) as bar:
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            results.append((refs[done[0]], ray.get(done[0])))
            bar.update()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.grid", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", type=Path, help="YAML grid file")
    parser.add_argument("--out", type=Path, required=True, help="root folder of the run directories")
    parser.add_argument("--workers", type=int, default=1, help="parallel local processes")
    parser.add_argument("--backend", choices=["local", "ray"], default="local")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and whether they are finished")
    args = parser.parse_args(argv)
    try:
        runs = plan(load_grid(args.grid), args.out)
        if args.dry_run:
            for r in runs:
                print(f"{'done' if r.done else 'todo'}  {r.run_dir}")
            return 0
        finished = sum(r.done for r in runs)
        print(f"{len(runs)} runs, {finished} already finished", file=sys.stderr)
        run_grid(runs, workers=args.workers, backend=args.backend)
    except ConfigError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
