"""How many members fit one population on a device: an estimate of a member's memory and the device's budget.

A member holds its replay buffer (observations and next observations as float32, actions int64, rewards and
terminations float32), its parameters four times (online, target, optimiser state, gradient) and its update's
activations (online and target networks, forward and backward: an upper estimate of 16 floats per hidden unit and
sample). A population allocates every member's buffer at the largest member's size. The budget is a share of the
device's free memory (:data:`SHARE`): CUDA's free memory, or the machine's available RAM.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import torch

__all__ = ["SHARE", "member_bytes", "population_bytes", "budget"]

#: the share of the device's free memory one population may take
SHARE = 0.8


def member_bytes(config: Mapping[str, Any], buffer_size: int | None = None) -> int:
    """Bytes of one member of a resolved ``dqn`` config (its buffer at ``buffer_size``, default its own)."""
    derived = config["derived"]
    d = math.prod(derived["observation_shape"])
    n = int(re.sub(r"\D", "", str(derived["action_space"])) or 1)
    widths = list(derived["hidden"]["q"])
    dims = [d, *widths, n]
    params = sum(a * b + b for a, b in zip(dims, dims[1:])) + 4 * sum(widths)  # (+ LayerNorm, per-unit activation)
    replay = int(buffer_size or config["buffer_size"]) * (2 * 4 * d + 8 + 4 + 4)
    activations = int(config["batch_size"]) * sum(widths) * 4 * 16
    return replay + 4 * 4 * params + activations


def population_bytes(configs: Sequence[Mapping[str, Any]]) -> int:
    """Bytes of a population of these members (every buffer at the largest member's size)."""
    largest = max(int(c["buffer_size"]) for c in configs)
    return len(configs) * member_bytes(configs[0], largest)


@lru_cache(maxsize=8)
def budget(device: str) -> int:
    """Bytes one population may take on ``device``: :data:`SHARE` of its free memory (read once per process: a
    grid's plan sizes every population by the same budget)."""
    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(torch.device(device))
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(SHARE * free)
