"""P paper-DQN agents trained in lockstep in one process: one batched network call, one optimiser step and one env
call per step for the whole population.

Each member is ``agents.train dqn`` with its own seed, learning rate, buffer size and epsilon schedule (the rest of
the config is the population's): the same network built the same way (SB3's policy under ``set_random_seed(seed)``:
the same initial weights), the same loop order per step (act, env step, store, target copy every
``target_update_interval`` steps, epsilon update, then one update once past ``learning_starts``), uniform actions
before ``learning_starts``, then epsilon-greedy with the paper's absolute schedule, MSE TD loss on SB3's replay
samples (``dones * (1 - timeouts)``), RMSprop with the member's learning rate. Members interact nowhere: their
parameters are stacked on a leading axis (``torch.func.stack_module_state``), one call runs every member's network
(see :data:`IMPLEMENTATIONS`), the loss is the sum of the members' losses (so each member's gradient is its own),
and RMSprop runs on the stacked tensors with a per-member learning rate. A member whose loss turns non-finite is
stopped there, as a single run is: that update is not applied, its learning rate becomes 0 and
:attr:`Population.diverged` holds the step.

Randomness is per member and explicit (:class:`Draws`): a member's exploration coin, its random actions and its
replay indices come from its own generator, and tests inject recorded draws to compare a member with SB3's DQN.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.func import functional_call, stack_module_state, vmap

from .envs import BATCHED_ENVS, BatchedEnv, make_batched
from .networks import (COMPILE_FROM, IMPLEMENTATIONS, _batched_forward, _rmsprop, _td_losses, eager_faster,
                       member_q_net)

__all__ = ["Member", "Draws", "Population", "config_refusal", "member_q_net", "IMPLEMENTATIONS"]


@dataclass(frozen=True)
class Member:
    """What differs between members (the config keys of :data:`agents.population.MEMBER_KEYS`, in order): the seed,
    the learning rate, the replay buffer's size and the epsilon schedule (initial and final epsilon, and the env steps
    of its linear decay after ``learning_starts``); a schedule field left None is the population config's."""

    seed: int
    learning_rate: float
    buffer_size: int
    exploration_initial_eps: float | None = None
    exploration_final_eps: float | None = None
    exploration_steps: int | None = None


def _schedules(config: Mapping[str, Any], members: Sequence[Member]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The members' epsilon schedules as arrays ``(P,)``: initial and final epsilon (float64) and decay steps
    (int64), a member's None taking the config's; a ValueError names a member's out-of-range value."""
    rows = []
    for m in members:
        row = tuple(config[k] if v is None else v for k, v in (("exploration_initial_eps", m.exploration_initial_eps),
                                                                ("exploration_final_eps", m.exploration_final_eps),
                                                                ("exploration_steps", m.exploration_steps)))
        if not (0 <= row[0] <= 1 and 0 <= row[1] <= 1) or row[2] is None or int(row[2]) != row[2] or row[2] < 0:
            raise ValueError(f"member {m}: epsilons must lie in [0, 1] and exploration_steps be an integer >= 0; "
                             f"got initial {row[0]}, final {row[1]}, steps {row[2]}")
        rows.append(row)
    initial, final, steps = zip(*rows)
    return np.array(initial, dtype=np.float64), np.array(final, dtype=np.float64), np.array(steps, dtype=np.int64)


class Draws:
    """Each member's random draws, one generator per member (from its seed): ``explore(m)`` a uniform in [0, 1)
    (epsilon's coin), ``action(m)`` a uniform action, ``all_indices(sizes, k)`` ``(P, k)`` replay indices, row ``m``
    in ``[0, sizes[m])`` from member ``m``'s generator. Integers are ``floor(u * n)`` of a uniform ``u`` on the 2^53
    grid (bias below n / 2^53), one ``random`` call per member, cheaper than numpy's ``integers``: replay indices
    are drawn for every member at every step. Tests inject other objects with these three methods (SB3's recorded
    draws)."""

    def __init__(self, seeds: Sequence[int], n_actions: int) -> None:
        self.rngs = [np.random.default_rng([s, 7]) for s in seeds]
        self.n_actions = n_actions

    def explore(self, m: int) -> float:
        return float(self.rngs[m].random())

    def action(self, m: int) -> int:
        return int(self.rngs[m].random() * self.n_actions)

    def all_indices(self, sizes: np.ndarray, k: int) -> np.ndarray:
        u = np.stack([rng.random(k) for rng in self.rngs])
        return (u * sizes[:, None]).astype(np.int64)


def config_refusal(config: Mapping[str, Any], device: str = "cpu") -> str | None:
    """Why the population engine cannot train runs of the resolved dqn ``config`` on ``device`` exactly as
    ``agents.train dqn`` would (another env, loss, optimiser, schedule, ...), or None if it can."""
    if config.get("env") not in BATCHED_ENVS:
        return f"no batched version of {config.get('env')!r}; the population engine runs {', '.join(BATCHED_ENVS)}"
    unsupported = {k: config.get(k) for k in ("train_freq", "gradient_steps", "n_steps", "n_envs")
                   if config.get(k, 1) != 1}
    if config.get("td_loss", "mse") != "mse" or config.get("optimizer") != "rmsprop" or unsupported or \
            config.get("max_grad_norm") is not None or config.get("tau", 1.0) != 1.0:
        return ("the population engine runs the paper's DQN: MSE TD loss, RMSprop, no clipping, one update per env "
                "step, 1-step returns, target copies, one env per member; got "
                f"{unsupported or 'another loss, optimiser, clipping or tau'}")
    ignored = {k: config.get(k) for k, ok in (("lr_schedule", "constant"), ("normalize_obs", False),
                                               ("normalize_reward", False), ("eval_every", None),
                                               ("sb3_log", None)) if (config.get(k) or ok) != ok}
    opt_extra = set(config.get("optimizer_kwargs") or {}) - {"alpha", "eps", "foreach"}
    if ignored or opt_extra or config.get("exploration_steps") is None:
        got = ignored or (f"optimizer_kwargs {sorted(opt_extra)}" if opt_extra else "exploration_steps unset")
        return ("the population engine runs the paper's DQN as agents.train dqn does with constant learning rates, "
                "RMSprop's alpha and eps, raw observations and rewards, no evaluation or SB3 logs and an "
                f"exploration_steps schedule; got {got}")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        return f"device {device!r}: this torch build or machine has no CUDA; use --device cpu"
    if config.get("env_kwargs"):
        return (f"the batched envs run the registered envs' defaults; env_kwargs {config['env_kwargs']} would make "
                "members differ from agents.train dqn's runs")
    return None


class Population:
    """The members of ``members`` on ``config`` (a resolved ``dqn`` config; its seed, learning rate, buffer size and
    epsilon schedule are the members'), stepping ``make_batched(config["env"])`` with one copy per member (copy
    ``m`` seeded with member ``m``'s seed, as ``make_vec_env`` seeds a run's env).

    ``nets``: initial networks per member (default :func:`member_q_net`); ``draws``: the members' randomness
    (default :class:`Draws`).
    """

    def __init__(self, config: Mapping[str, Any], members: Sequence[Member], *, device: str = "cpu",
                 nets: Sequence[nn.Module] | None = None, draws: Any = None, implementation: str = "auto") -> None:
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
        if not members:
            raise ValueError("a population needs at least one member")
        if (why := config_refusal(config, device)) is not None:
            raise ValueError(why)
        self.config, self.members, self.device = dict(config), list(members), torch.device(device)
        self.P = len(members)
        nets = list(nets) if nets is not None else [member_q_net(config, m.seed) for m in members]
        # the MLP after SB3's flatten (vector observations; SB3's float32 cast of Box observations is left out, so
        # that float64 networks stay float64 in the twin tests)
        heads = [n.q_net.to(self.device) for n in nets]
        self.base = copy.deepcopy(heads[0])  # (its own tensors are replaced in every call)
        params, buffers = stack_module_state(heads)
        # the batched path runs parameter-free layers as the base's own modules: only if no member's buffers differ
        batched = _batched_forward(self.base, compiled=False) is not None and \
            all(bool((v == v[:1]).all()) for v in buffers.values())
        if implementation in ("batched", "compiled") and not batched:
            raise ValueError(f"implementation={implementation!r} runs MLPs of Linear, LayerNorm, ReLU, Elephant, "
                             f"Maxout, LWTA and FTA layers whose buffers all members share, not {self.base}; use "
                             "'auto' or 'vmap'")
        self._auto, self._compiled_ok = implementation == "auto", False
        if implementation == "auto":
            implementation = "vmap" if not batched else "batched" if eager_faster(self.base) else \
                "compiled" if self.P * int(config["n_timesteps"]) >= COMPILE_FROM else "batched"
        self.implementation = implementation
        self._build_paths()
        self.params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        self.buffers = buffers
        self.dtype = next(iter(self.params.values())).dtype  # float32 (float64 for the twin tests)
        self.target = {k: v.detach().clone() for k, v in self.params.items()}
        self.square_avg = {k: torch.zeros_like(v) for k, v in self.params.items()}
        opt = dict(config.get("optimizer_kwargs") or {})
        self.alpha, self.eps = float(opt.get("alpha", 0.99)), float(opt.get("eps", 1e-8))
        self.lr = torch.tensor([m.learning_rate for m in members], dtype=self.dtype, device=self.device)
        self.eps_initial, self.eps_final, self.eps_steps = _schedules(config, members)
        self.env: BatchedEnv = make_batched(config["env"], self.P, max_episode_steps=config.get("max_episode_steps"),
                                            seeds=[m.seed for m in members])
        self.n_actions = self.env.n_actions
        self.draws = draws if draws is not None else Draws([m.seed for m in members], self.n_actions)
        self.capacity = np.array([m.buffer_size for m in members])
        cap, d = int(self.capacity.max()), self.env.obs_dim
        self.obs_buf = np.zeros((self.P, cap, d), dtype=np.float32)
        self.next_buf = np.zeros((self.P, cap, d), dtype=np.float32)
        self.act_buf = np.zeros((self.P, cap), dtype=np.int64)
        self.rew_buf = np.zeros((self.P, cap), dtype=np.float32)
        self.done_buf = np.zeros((self.P, cap), dtype=np.float32)  # dones * (1 - timeouts), as SB3 samples them
        self.pos = np.zeros(self.P, dtype=np.int64)
        self.size = np.zeros(self.P, dtype=np.int64)
        self.obs = self.env.reset()
        self.num_timesteps = 0
        self.episodes: list[list[tuple[int, float, int]]] = [[] for _ in range(self.P)]  # (step, return, length)
        self.last_losses: Tensor | None = None  # the members' TD losses at the latest update
        self.seconds = {"acting": 0.0, "env": 0.0, "update": 0.0}  # where the time went (benchmarks)
        self.diverged = np.zeros(self.P, dtype=np.int64)  # the step of a member's non-finite loss; 0: none
        self._episode = np.zeros(self.P)
        self._length = np.zeros(self.P, dtype=np.int64)

    @property
    def diverged_at(self) -> np.ndarray:
        """:attr:`diverged`, as the host knows it (here: always; the device step reads it back now and then)."""
        return self.diverged

    def _build_paths(self) -> None:
        """The implementation's callables (rebuilt after unpickling: compiled code does not pickle)."""
        gamma = float(self.config["gamma"])
        self._batched = _batched_forward(self.base, compiled=False) if self.implementation == "batched" else None
        self._losses = lambda *args: _td_losses(lambda p, x: self.q_values(x, p), gamma, *args)  # noqa: E731
        self._rmsprop = _rmsprop
        if self.implementation == "compiled":
            plain = _batched_forward(self.base, compiled=True)
            self._batched = _batched_forward(self.base, compiled=False)  # acting: one observation per member, eager
            self._losses = torch.compile(lambda *args: _td_losses(plain, gamma, *args), dynamic=False)
            self._rmsprop = torch.compile(_rmsprop, dynamic=False)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_batched", "_losses", "_rmsprop")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # a checkpoint without ``diverged`` holds no diverged member
        self.__dict__.setdefault("diverged", np.zeros(self.P, dtype=np.int64))
        self.__dict__.setdefault("_auto", True)
        if "eps_steps" not in state:  # (checkpoints without per-member schedules: the config's for every member)
            self.eps_initial, self.eps_final, self.eps_steps = _schedules(self.config, self.members)
        self._compiled_ok = False  # (compiled again here, maybe on another machine)
        self._build_paths()

    # --- network ----------------------------------------------------------------------------------------

    def q_values(self, obs: Tensor, params: Mapping[str, Tensor] | None = None) -> Tensor:
        """``(P, B, actions)`` Q-values of ``obs`` ``(P, B, obs_dim)``, member ``m`` on its own network."""
        params = self.params if params is None else params
        obs = obs.to(self.dtype)

        def one(p: Mapping[str, Tensor], b: Mapping[str, Tensor], x: Tensor) -> Tensor:
            return functional_call(self.base, (p, b), (x,))

        if self._batched is not None:
            return self._batched({**params, **self.buffers}, obs)
        if self.implementation == "loop":
            return torch.stack([one({k: v[m] for k, v in params.items()}, {k: v[m] for k, v in self.buffers.items()},
                                    obs[m]) for m in range(self.P)])
        return vmap(one)(params, self.buffers, obs)

    # --- the loop ---------------------------------------------------------------------------------------

    def epsilon(self, t: int) -> np.ndarray:
        """The members' exploration rates ``(P,)`` after ``t`` env steps (each its own absolute schedule, as
        ``agents.rl.dqn.PaperDQN.epsilon``)."""
        frac = np.clip((t - self.config["learning_starts"]) / np.maximum(self.eps_steps, 1), 0.0, 1.0)
        frac = np.where(self.eps_steps == 0, 1.0, frac)
        return self.eps_initial + frac * (self.eps_final - self.eps_initial)

    def _actions(self) -> np.ndarray:
        t = self.num_timesteps
        if t < self.config["learning_starts"]:
            return np.array([self.draws.action(m) for m in range(self.P)])
        eps = self.epsilon(t)
        coins = [self.draws.explore(m) < eps[m] for m in range(self.P)]
        with torch.no_grad():
            greedy = self.q_values(torch.as_tensor(self.obs, device=self.device)[:, None]).argmax(-1)[:, 0]
        greedy = greedy.cpu().numpy()
        return np.array([self.draws.action(m) if coins[m] else greedy[m] for m in range(self.P)])

    def step(self, before_store: Callable[[], None] | None = None) -> None:
        """One env step of every member, its storage, target copy and (past ``learning_starts``) update;
        ``before_store`` is called after the env step, before the rest, where SB3 calls a callback's ``on_step``."""
        t0 = time.perf_counter()
        actions = self._actions()
        t1 = time.perf_counter()
        out = self.env.step(actions)
        self.seconds["acting"] += t1 - t0
        self.seconds["env"] += time.perf_counter() - t1
        self.num_timesteps += 1
        if before_store is not None:
            before_store()
        rows = np.arange(self.P)
        self.obs_buf[rows, self.pos] = self.obs
        self.next_buf[rows, self.pos] = out.terminal
        self.act_buf[rows, self.pos] = actions
        self.rew_buf[rows, self.pos] = out.reward
        self.done_buf[rows, self.pos] = out.terminated  # a truncation is not an end (SB3: dones * (1 - timeouts))
        self.pos = (self.pos + 1) % self.capacity
        self.size = np.minimum(self.size + 1, self.capacity)
        self._episode += out.reward
        self._length += 1
        for m in np.flatnonzero(out.done):
            self.episodes[m].append((self.num_timesteps, float(self._episode[m]), int(self._length[m])))
            self._episode[m], self._length[m] = 0.0, 0
        self.obs = out.obs
        if self.num_timesteps % self.config["target_update_interval"] == 0:
            self.target = {k: v.detach().clone() for k, v in self.params.items()}
        if self.num_timesteps > self.config["learning_starts"]:
            t0 = time.perf_counter()
            self.update()
            self.seconds["update"] += time.perf_counter() - t0

    def update(self) -> Tensor:
        """One RMSprop step of every member on its own replay sample; the members' losses ``(P,)``. Under "auto",
        a compile that fails at the first update (no C++ compiler, say) falls back to "batched" with a warning; asked
        for by name, it is an error naming the cause."""
        batch = self._sample()  # drawn once: a retry after a failed compile trains on the same sample
        if self.implementation != "compiled" or self._compiled_ok:
            return self._update(*batch)
        try:
            losses = self._update(*batch)
        except Exception as err:  # Inductor's failures have many types; the first update is where they show
            if not self._auto:
                raise RuntimeError(f"implementation='compiled': torch.compile failed ({type(err).__name__}: "
                                   f"{str(err).splitlines()[0] if str(err) else ''}); use 'batched'") from err
            warnings.warn(f"torch.compile failed ({type(err).__name__}); the population runs 'batched' instead",
                          stacklevel=2)
            self.implementation = "batched"
            self._build_paths()
            return self._update(*batch)
        self._compiled_ok = True
        return losses

    def _sample(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Every member's replay sample, drawn with its own generator: obs and next obs ``(P, batch, obs_dim)``,
        actions, rewards and terminations ``(P, batch)``."""
        k = self.config["batch_size"]
        idx = self.draws.all_indices(self.size, k)
        rows = np.arange(self.P)[:, None]
        as_t = lambda a: torch.as_tensor(a, device=self.device)  # noqa: E731
        obs, nxt = as_t(self.obs_buf[rows, idx]).to(self.dtype), as_t(self.next_buf[rows, idx]).to(self.dtype)
        act = as_t(self.act_buf[rows, idx])
        rew, done = as_t(self.rew_buf[rows, idx]).to(self.dtype), as_t(self.done_buf[rows, idx]).to(self.dtype)
        return obs, act, nxt, rew, done

    def _update(self, obs: Tensor, act: Tensor, nxt: Tensor, rew: Tensor, done: Tensor) -> Tensor:
        if self.implementation == "loop":  # SB3's kernels: one MSE loss per member
            with torch.no_grad():
                y = rew + (1 - done) * self.config["gamma"] * self.q_values(nxt, self.target).max(-1).values
            q = self.q_values(obs).gather(-1, act[..., None])[..., 0]
            losses = torch.stack([F.mse_loss(q[m], y[m]) for m in range(self.P)])
        else:
            losses = self._losses(self.params, self.target, obs, act, nxt, rew, done)
        grads = torch.autograd.grad(losses.sum(), list(self.params.values()))
        finite = torch.isfinite(losses)
        if not bool(finite.all()):  # those members stop here, as a run stops at a non-finite loss
            for m in torch.nonzero(~finite).flatten().tolist():
                self.diverged[m] = self.diverged[m] or self.num_timesteps
            self.lr = torch.where(finite, self.lr, torch.zeros_like(self.lr))
            grads = [torch.where(finite.view(-1, *([1] * (g.dim() - 1))), g, torch.zeros_like(g)) for g in grads]
        with torch.no_grad():
            self._rmsprop(list(self.params.values()), grads, list(self.square_avg.values()), self.lr, self.alpha,
                          self.eps)
        self.last_losses = losses.detach()
        return self.last_losses

    def member_state(self, m: int) -> dict[str, Tensor]:
        """Member ``m``'s ``state_dict`` as SB3's Q-network names it (parameters and persistent buffers)."""
        keys = self.base.state_dict().keys()
        return {f"q_net.{k}": v[m].detach() for k, v in (*self.params.items(), *self.buffers.items()) if k in keys}

    def member_probe_context(self, m: int, model: nn.Module, rng: np.random.Generator) -> dict[str, Any]:
        """What a probe sees of member ``m`` (the fields of :class:`probes.ProbeContext` but step and inputs), as
        :func:`probes.sb3.dqn_context` gives it of SB3's DQN: ``model`` (the member's ``QNetwork``, loaded here with
        its current weights), the per-sample TD loss ``(q - target)^2`` and ``sample(k)``, ``k`` rows of its replay
        buffer drawn with ``rng`` (the probe's own, never the member's draws) with targets from its target network."""
        model.load_state_dict(self.member_state(m))
        target = {k: v[m] for k, v in self.target.items()}

        def sample(k: int) -> tuple[Tensor, Tensor, Tensor]:
            if self.size[m] == 0:
                raise RuntimeError("the replay buffer is empty; probe after learning_starts")
            idx = rng.integers(0, int(self.size[m]), size=k)
            as_t = lambda a: torch.as_tensor(a, device=self.device)  # noqa: E731
            with torch.no_grad():
                next_q = functional_call(self.base, ({**target, **{k: v[m] for k, v in self.buffers.items()}},),
                                         (as_t(self.next_buf[m, idx]).to(self.dtype),)).max(-1).values
                y = as_t(self.rew_buf[m, idx]).to(self.dtype) + \
                    (1 - as_t(self.done_buf[m, idx]).to(self.dtype)) * self.config["gamma"] * next_q
            return as_t(self.obs_buf[m, idx]), as_t(self.act_buf[m, idx]), y

        def td(q_net: nn.Module, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
            obs, actions, y = batch
            return (q_net(obs).gather(1, actions[:, None]).squeeze(1) - y) ** 2

        return {"model": model, "losses": {"td": td}, "sample": sample}

    def stored_observations(self, m: int, n: int, rng: np.random.Generator) -> Tensor | None:
        """``n`` distinct observations member ``m`` has stored, in buffer-index order (None until it has ``n``),
        chosen as :class:`probes.sb3.ProbeCallback` chooses a run's fixed probe inputs."""
        if self.size[m] < n:
            return None
        idx = np.sort(rng.choice(int(self.size[m]), size=n, replace=False))
        return torch.as_tensor(self.obs_buf[m, idx], device=self.device)

    def learn(self, steps: int, on_step: Callable[[Population], None] | None = None) -> None:
        for _ in range(steps):
            self.step()
            if on_step is not None:
                on_step(self)
