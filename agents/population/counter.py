"""Counter-based random draws: each value a pure function of (member seed, stream, counter, index), computed with
integer tensor ops on any device.

A member's draws do not depend on how many members share its population, on their order or on the device, and
drawing them needs no generator state, no host round trip and no graph break (:mod:`agents.population.device`
draws every step's coins, actions, replay indices and env resets this way). The hash is Wellons' ``lowbias32``
chained over the key's 32-bit words; two chained outputs give a uniform on the 2^53 grid, as numpy's ``random()``.
Every multiplication is split into 16-bit halves, so no intermediate leaves int64's range (overflow is undefined
in the C++ a compiler emits). :class:`CounterDraws` and :class:`CounterGenerator` give the same values to the
exact, numpy-driven :class:`agents.population.engine.Population` (its twin tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["EXPLORE", "ACTION", "INDEX", "RESET", "uniform", "below", "CounterDraws", "CounterGenerator"]

#: the streams of a member's draws
EXPLORE, ACTION, INDEX, RESET = 1, 2, 3, 4
_M32, _M16 = 0xFFFFFFFF, 0xFFFF


def _mul32(x: Tensor, c: int) -> Tensor:
    """``x * c mod 2^32`` for ``x`` in [0, 2^32), every product below 2^49."""
    return ((((x >> 16) * c) & _M16) << 16) + (x & _M16) * c & _M32


def _mix(x: Tensor) -> Tensor:
    """Wellons' lowbias32 on ``x & 0xFFFFFFFF``."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform(seed: Tensor, stream: int, counter: Tensor | int, index: Tensor | int = 0) -> Tensor:
    """Uniforms in [0, 1), float64, of the broadcast keys: ``seed`` (< 2^32, an int64 tensor), ``stream``,
    ``counter`` (< 2^63) and ``index`` (< 2^32), int64 tensors or Python ints (used as they are: no tensor is made
    of them, so no host-to-device copy). Each key word is hashed before it joins the state, so two seeds' streams
    share values only by chance (a plain XOR of the words would make one seed's stream another's, reordered). The
    values lie on the 2^-53 grid but come from a 32-bit state: at most 2^32 distinct values."""
    h = _mix(seed + 0x9E3779B9)
    for word, salt in ((stream, 0x85EBCA6B), (counter & _M32, 0xC2B2AE35), (counter >> 32, 0x27D4EB2F),
                       (index, 0x165667B1)):
        h = _mix(h ^ _mix_word(word, salt))
    a, b = _mix(h ^ 0x68E31DA4) >> 5, _mix(h ^ 0xB5297A4D) >> 6  # 27 and 26 bits
    return (a * 67108864 + b).to(torch.float64) * (1.0 / 9007199254740992.0)


def _mix_word(word: Tensor | int, salt: int) -> Tensor | int:
    """``_mix(word + salt)``: on a tensor, or in Python for an int (then a Python int, which tensors take as is)."""
    if isinstance(word, Tensor):
        return _mix(word + salt)
    return _lowbias32(word + salt)


def _lowbias32(x: int) -> int:
    """:func:`_mix` in Python integers."""
    x &= _M32
    x ^= x >> 16
    x = x * 0x7FEB352D & _M32
    x ^= x >> 15
    x = x * 0x846CA68B & _M32
    return x ^ (x >> 16)


def below(u: Tensor, n: Tensor | int) -> Tensor:
    """``floor(u * n)`` as int64, at most ``n - 1`` (``u`` from :func:`uniform`; ``n`` a tensor or a Python int)."""
    if isinstance(n, Tensor):
        return torch.minimum((u * n).to(torch.int64), n - 1)
    return (u * n).to(torch.int64).clamp(max=n - 1)


class CounterDraws:
    """:class:`agents.population.engine.Draws`'s interface with the counter-based values the device step draws:
    ``clock()`` gives the step the population is at (its ``num_timesteps``)."""

    def __init__(self, seeds: Sequence[int], n_actions: int, clock: Callable[[], int]) -> None:
        self.seeds, self.n_actions, self.clock = torch.tensor(list(seeds), dtype=torch.int64), n_actions, clock

    def explore(self, m: int) -> float:
        return float(uniform(self.seeds[m], EXPLORE, self.clock()))

    def action(self, m: int) -> int:
        return int(below(uniform(self.seeds[m], ACTION, self.clock()), self.n_actions))

    def all_indices(self, sizes: np.ndarray, k: int) -> np.ndarray:
        u = uniform(self.seeds[:, None], INDEX, self.clock(), torch.arange(k)[None, :])
        return below(u, torch.as_tensor(sizes, dtype=torch.int64)[:, None]).numpy()


class CounterGenerator:
    """The reset draws of one env copy, as the device envs draw them, behind the methods of numpy's generator the
    numpy envs call: the ``k``-th call (``random``, ``uniform`` or ``integers``) takes ``uniform(seed, RESET, k,
    j)`` for its values ``j = 0, 1, ...``."""

    def __init__(self, seed: int) -> None:
        self.seed, self.count = int(seed), 0

    def _draw(self, size: int | tuple[int, ...] | None) -> np.ndarray:
        n = int(np.prod(size)) if size is not None else 1
        u = uniform(torch.tensor(self.seed), RESET, self.count, torch.arange(n)).numpy()
        self.count += 1
        return u if size is None else u.reshape(size)

    def random(self, size: int | tuple[int, ...] | None = None) -> float | np.ndarray:
        u = self._draw(size)
        return float(u[0]) if size is None else u

    def uniform(self, low: float = 0.0, high: float = 1.0,
                size: int | tuple[int, ...] | None = None) -> float | np.ndarray:
        u = self.random(size)
        return low + (high - low) * u

    def integers(self, low: int, high: int | None = None) -> int:
        """An integer in ``[low, high)`` (``[0, low)`` without ``high``): ``low +`` :func:`below` of the call's
        uniform."""
        low, high = (0, low) if high is None else (low, high)
        return low + int(below(torch.tensor(self.random(), dtype=torch.float64), high - low))
