"""Provenance of a training run: software versions, git state, host, time, command line.

`provenance()` returns a JSON-serialisable dict that `runlog.RunLog` stores in the
root attributes of every run log, so a plot can always be traced back to the code and
environment that produced it.
"""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

#: Distributions whose versions are recorded (those not installed are left out).
PACKAGES = ("torch", "numpy", "h5py", "gymnasium", "stable-baselines3", "ale-py")

_GIT_TIMEOUT_S = 10.0
_plugins: Callable[[], dict[str, str]] = dict  # what reports the loaded plugins (see report_plugins)


def report_plugins(loaded: Callable[[], dict[str, str]]) -> None:
    """Have :func:`provenance` record ``loaded()`` as the plugin modules loaded (called by :mod:`probes.plugins`,
    which the run log does not import)."""
    global _plugins
    _plugins = loaded


def provenance() -> dict:
    """Describe the current process and environment.

    Returns a dict with keys:
      - ``versions``: ``{"python": "3.11.7", "<distribution>": "<version>", ...}`` for the
        distributions in `PACKAGES` that are installed;
      - ``git_commit``: ``git rev-parse HEAD`` of the repository containing this package,
        or ``"unknown"`` (no git, not a repository, no commit yet);
      - ``git_dirty``: whether tracked files differ from that commit (``None`` if unknown);
      - ``hostname``, ``platform`` (``platform.platform()``);
      - ``time_utc``: ISO 8601 UTC timestamp, seconds resolution;
      - ``argv``: ``sys.argv`` as a list;
      - ``plugins``: ``{module: file}`` of the plugin modules loaded (:mod:`probes.plugins`, which reports them
        with :func:`report_plugins`; ``{}`` where it was never imported).
    """
    commit, dirty = _git_state(Path(__file__).resolve().parent)
    return {
        "versions": {"python": platform.python_version(), **_package_versions()},
        "git_commit": commit,
        "git_dirty": dirty,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "argv": list(sys.argv),
        "plugins": _plugins(),
    }


def _package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def _git(cwd: Path, *args: str) -> str | None:
    """stdout of ``git <args>`` run in `cwd`, or None if git is missing or fails."""
    try:
        result = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=_GIT_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def _git_state(cwd: Path) -> tuple[str, bool | None]:
    """(commit hash or 'unknown', dirty flag or None) of the repository containing `cwd`."""
    commit = _git(cwd, "rev-parse", "--verify", "--quiet", "HEAD")
    if not commit:
        return "unknown", None
    status = _git(cwd, "status", "--porcelain", "--untracked-files=no")
    return commit, None if status is None else bool(status)
