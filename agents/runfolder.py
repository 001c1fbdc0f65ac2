"""The run-folder contract shared by every learner and the grid: which config keys never change what a run
computes, and whether a folder's files were made with a given config."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import yaml

from .errors import RunWriteError

__all__ = ["OUTPUT_KEYS", "comparable_config", "holds_config", "write_run_file"]


#: config keys that change how a run shows progress, saves or logs, or where it keeps its replay's frames, never what
#: it computes: a change in them neither makes a finished run stale (grid) nor a checkpoint foreign (--resume)
OUTPUT_KEYS = ("progress", "torch_threads", "checkpoint_every", "sb3_log", "frames_on")


def comparable_config(config: Any) -> Any:
    """``config`` as it reads back from JSON or YAML (tuples become lists), without :data:`OUTPUT_KEYS`: equal for
    configs whose runs compute the same."""
    plain = json.loads(json.dumps(config, default=str))
    return {k: v for k, v in plain.items() if k not in OUTPUT_KEYS} if isinstance(plain, dict) else plain


def holds_config(run_dir: str | Path, config: Mapping[str, Any]) -> bool:
    """Whether the files in ``run_dir`` were made with ``config``: its ``config.yaml`` equals it (by
    :func:`comparable_config`); False if that file is missing or unreadable."""
    try:
        saved = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return False
    return comparable_config(saved) == comparable_config(config)


def write_run_file(path: Path, content: str | bytes | Callable[[IO[bytes]], Any]) -> None:
    """Write one of a run's files whole or not at all: ``content`` (text, bytes, or a saver that writes into a binary
    file, e.g. ``model.save``) goes into a temporary file beside ``path``, is flushed to disk and renamed over it.
    :class:`RunWriteError` (exit status 4) names the file and the system's reason if anything fails (a full disk, an
    I/O error, the file size limit); the temporary file is removed and ``path`` keeps what it had."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode() if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise RunWriteError(f"{path}: cannot write it ({err.strerror or err}): the disk may be full or failing")
