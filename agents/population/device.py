"""The population's step on its device: P paper-DQN agents whose acting, env step, replay, sampling, update and
target copy all run as tensor ops, with no host synchronisation inside a step.

Everything :class:`agents.population.engine.Population` does per step, in its order, with these differences:
replay buffers, epsilon coins, random actions, replay indices and env resets live on the device and are drawn by
counter (:mod:`agents.population.counter`: a member's draws depend only on its seed, not on P, grouping or device);
the env is the task's tensor version (:mod:`agents.population.device_envs`); finished episodes are written into
device tensors and read back every :attr:`DevicePopulation.readback` steps; a diverged member (non-finite loss)
stops as there, its step kept on the device. The host's only decisions are on its own step count (act at random
before ``learning_starts``; the target copy's interval; updates once past ``learning_starts``), so each of
:meth:`DevicePopulation.act_phase` and :meth:`DevicePopulation.update_phase` traces as one graph
(``torch.compile(..., fullgraph=True)``). Its slow twin is the exact engine with :class:`~.counter.CounterDraws`
and :class:`~.counter.CounterGenerator` (tests/test_population_device.py: equal in float64).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, stack_module_state

from .counter import ACTION, EXPLORE, INDEX, below, uniform
from .device_envs import TORCH_ENVS
from .engine import Member, _schedules, config_refusal
from .networks import _batched_forward, _rmsprop, _td_losses, member_q_net

__all__ = ["DEVICE_MODES", "DevicePopulation", "device_refusal"]

#: the device step's implementations (``implementation=`` of :func:`agents.population.run.run_population`): eager,
#: or both phases through ``torch.compile``
DEVICE_MODES = ("device", "device-compiled")


def device_refusal(config: Mapping[str, Any], device: str = "cpu") -> str | None:
    """Why the device step cannot train ``config`` (the engine's refusals, or a task without a tensor version)."""
    if (why := config_refusal(config, device)) is not None:
        return why
    if config.get("env") not in TORCH_ENVS:
        return f"no tensor version of {config.get('env')!r}; the device step runs {', '.join(TORCH_ENVS)}"
    return None


class DevicePopulation:
    """The members of ``members`` on ``config`` (a resolved ``dqn`` config), every tensor on ``device``.

    ``nets``: initial networks per member (default :func:`member_q_net`, float32); ``readback``: steps between
    reading finished episodes back to the host; ``compile``: run both phases through ``torch.compile`` (one graph
    each, compiled at their first call; a C++ compiler on CPU).
    """

    def __init__(self, config: Mapping[str, Any], members: Sequence[Member], *, device: str = "cpu",
                 nets: Sequence[nn.Module] | None = None, readback: int = 1000, compile: bool = False) -> None:
        if not members:
            raise ValueError("a population needs at least one member")
        if (why := device_refusal(config, device)) is not None:
            raise ValueError(why)
        self.config, self.members, self.device = dict(config), list(members), torch.device(device)
        self.P, dev = len(members), self.device
        nets = list(nets) if nets is not None else [member_q_net(config, m.seed) for m in members]
        heads = [n.q_net.to(dev) for n in nets]
        self.base = copy.deepcopy(heads[0])
        self.compiled = bool(compile)
        params, buffers = stack_module_state(heads)
        if _batched_forward(self.base, compiled=False) is None or \
                not all(bool((v == v[:1]).all()) for v in buffers.values()):
            raise ValueError(f"the device step runs MLPs of Linear, LayerNorm, ReLU, Elephant, Maxout, LWTA and FTA "
                             f"layers whose buffers all members share, not {self.base}")
        self.buffers = buffers
        self.params = {k: v.detach().clone() for k, v in params.items()}
        self.dtype = next(iter(self.params.values())).dtype
        self.target = {k: v.clone() for k, v in self.params.items()}
        self.square_avg = {k: torch.zeros_like(v) for k, v in self.params.items()}
        opt = dict(config.get("optimizer_kwargs") or {})
        self.alpha, self.eps = float(opt.get("alpha", 0.99)), float(opt.get("eps", 1e-8))
        self.gamma, self.batch = float(config["gamma"]), int(config["batch_size"])
        self.lr = torch.tensor([m.learning_rate for m in members], dtype=self.dtype, device=dev)
        initial, final, steps = _schedules(config, members)
        self.eps_initial, self.eps_final = (torch.as_tensor(a, device=dev) for a in (initial, final))
        self.eps_steps = torch.as_tensor(steps, device=dev)
        self.seeds = torch.tensor([m.seed for m in members], dtype=torch.int64, device=dev)
        self.env = TORCH_ENVS[config["env"]](self.seeds, config.get("max_episode_steps"))
        self.n_actions, d = self.env.n_actions, self.env.obs_dim
        self.capacity = torch.tensor([m.buffer_size for m in members], dtype=torch.int64, device=dev)
        cap = max(m.buffer_size for m in members)
        self.obs_buf = torch.zeros(self.P, cap, d, dtype=torch.float32, device=dev)
        self.next_buf = torch.zeros_like(self.obs_buf)
        self.act_buf = torch.zeros(self.P, cap, dtype=torch.int64, device=dev)
        self.rew_buf = torch.zeros(self.P, cap, dtype=torch.float32, device=dev)
        self.done_buf = torch.zeros_like(self.rew_buf)  # dones * (1 - timeouts), as SB3 samples them
        self.pos = torch.zeros(self.P, dtype=torch.int64, device=dev)
        self.size = torch.zeros_like(self.pos)
        self.rows = torch.arange(self.P, device=dev)
        self.obs = self.env.reset()
        self.num_timesteps = 0  # the host's count
        self.clock = torch.zeros((), dtype=torch.int64, device=dev)  # the same count on the device
        self.diverged = torch.zeros(self.P, dtype=torch.int64, device=dev)  # step of a non-finite loss; 0: none
        self.diverged_at = np.zeros(self.P, dtype=np.int64)  # the same, as of the last read-back
        self.diverged_loss = torch.zeros(self.P, dtype=self.dtype, device=dev)  # the loss it diverged with
        self.diverged_loss_at = np.zeros(self.P)  # the same, as of the last read-back
        self.readback = int(readback)
        self._return = torch.zeros(self.P, dtype=torch.float64, device=dev)
        self._length = torch.zeros(self.P, dtype=torch.int64, device=dev)
        self._ends = torch.zeros(self.readback, self.P, dtype=torch.bool, device=dev)
        self._returns = torch.zeros(self.readback, self.P, dtype=torch.float64, device=dev)
        self._lengths = torch.zeros(self.readback, self.P, dtype=torch.int64, device=dev)
        self.episodes: list[list[tuple[int, float, int]]] = [[] for _ in range(self.P)]  # (step, return, length)
        self.last_losses: Tensor | None = None
        self._read_to = 0  # the steps whose episodes are in :attr:`episodes`
        self._build_paths()

    @property
    def implementation(self) -> str:
        return "device-compiled" if self.compiled else "device"

    def _build_paths(self) -> None:
        """The network's callable and the phases (rebuilt after unpickling: neither pickles)."""
        # compiled: the form Inductor fuses (plain ops, which torch.func and Dynamo trace); eager: fused kernels
        self.forward = _batched_forward(self.base, compiled=self.compiled)
        self._act, self._update = self.act_phase, self.update_phase
        self._compiled_ok: set[str] = set()
        if self.compiled:
            self._act = torch.compile(self.act_phase, fullgraph=True, dynamic=False)
            self._update = torch.compile(self.update_phase, fullgraph=True, dynamic=False)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("forward", "_act", "_update", "_compiled_ok")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._build_paths()

    # --- one step: two phases, each one graph ------------------------------------------------------------

    def q_values(self, obs: Tensor, params: Mapping[str, Tensor] | None = None) -> Tensor:
        """``(P, B, actions)`` Q-values of ``obs`` ``(P, B, obs_dim)``, member ``m`` on its own network."""
        return self.forward({**(self.params if params is None else params), **self.buffers}, obs.to(self.dtype))

    def act_phase(self, explore_only: bool) -> None:
        """Act (uniform actions if ``explore_only``, else epsilon-greedy on the members' schedules), step the env,
        store the transition and count episodes (into the read-back tensors' row of this step)."""
        t = self.clock
        slot = (t % self.readback)[None]  # (a tensor index: no host read)
        random_actions = below(uniform(self.seeds, ACTION, t), self.n_actions)
        if explore_only:
            actions = random_actions
        else:
            frac = ((t - self.config["learning_starts"]).double() / self.eps_steps.clamp(min=1).double()).clamp(0.0, 1.0)
            frac = torch.where(self.eps_steps == 0, 1.0, frac)
            eps = self.eps_initial + frac * (self.eps_final - self.eps_initial)
            with torch.no_grad():
                greedy = self.q_values(self.obs[:, None]).argmax(-1)[:, 0]
            actions = torch.where(uniform(self.seeds, EXPLORE, t) < eps, random_actions, greedy)
        out = self.env.step(actions)
        self.clock += 1
        self.obs_buf[self.rows, self.pos] = self.obs
        self.next_buf[self.rows, self.pos] = out.terminal
        self.act_buf[self.rows, self.pos] = actions
        self.rew_buf[self.rows, self.pos] = out.reward
        self.done_buf[self.rows, self.pos] = out.terminated.to(torch.float32)
        self.pos = (self.pos + 1) % self.capacity
        self.size = torch.minimum(self.size + 1, self.capacity)
        done = out.terminated | out.truncated
        self._return = self._return + out.reward.to(torch.float64)
        self._length = self._length + 1
        self._ends[slot] = done[None]
        self._returns[slot] = self._return[None]
        self._lengths[slot] = self._length[None]
        self._return = torch.where(done, 0.0, self._return)
        self._length = torch.where(done, 0, self._length)
        self.obs = out.obs

    def _losses(self, params: Mapping[str, Tensor], obs: Tensor, act: Tensor, nxt: Tensor, rew: Tensor,
                done: Tensor) -> tuple[Tensor, Tensor]:
        losses = _td_losses(lambda p, x: self.q_values(x, p), self.gamma, params, self.target, obs, act, nxt, rew,
                            done)
        return losses.sum(), losses

    def update_phase(self) -> Tensor:
        """One RMSprop step of every member on its own replay sample (indices drawn by counter); the losses ``(P,)``.
        A member whose loss is not finite takes no step and stops (learning rate 0, its step in ``diverged``)."""
        u = uniform(self.seeds[:, None], INDEX, self.clock, torch.arange(self.batch, device=self.device)[None, :])
        idx = below(u, self.size[:, None])
        rows = self.rows[:, None]
        batch = (self.obs_buf[rows, idx].to(self.dtype), self.act_buf[rows, idx],
                 self.next_buf[rows, idx].to(self.dtype), self.rew_buf[rows, idx].to(self.dtype),
                 self.done_buf[rows, idx].to(self.dtype))
        if self.compiled:
            grads, (_, losses) = grad_and_value(self._losses, has_aux=True)(self.params, *batch)
        else:
            with torch.enable_grad():
                params = {k: v.detach().requires_grad_(True) for k, v in self.params.items()}
                total, losses = self._losses(params, *batch)
                grads = dict(zip(params, torch.autograd.grad(total, list(params.values()))))
            losses = losses.detach()
        finite = torch.isfinite(losses)
        newly = ~finite & (self.diverged == 0)
        self.diverged = torch.where(newly, self.clock, self.diverged)
        self.diverged_loss = torch.where(newly, losses, self.diverged_loss)
        self.lr = torch.where(finite, self.lr, 0.0)
        names = list(self.params)
        grads = [torch.where(finite.view(-1, *([1] * (grads[k].dim() - 1))), grads[k], 0.0) for k in names]
        _rmsprop([self.params[k] for k in names], grads, [self.square_avg[k] for k in names], self.lr, self.alpha,
                 self.eps)
        self.last_losses = losses.detach()
        return self.last_losses

    def _phase(self, name: str, *args: Any) -> None:
        """Run a phase; the first compiled call of each names the cause if ``torch.compile`` fails there (no C++
        compiler or Triton, say) rather than ending in the compiler's traceback."""
        fn = self._act if name == "act" else self._update
        if not self.compiled or name in self._compiled_ok:
            fn(*args)
            return
        try:
            fn(*args)
        except Exception as err:  # Inductor's failures have many types; the first call is where they show
            raise RuntimeError(f"implementation 'device-compiled': torch.compile failed in the {name} phase "
                               f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); use "
                               "'device'") from err
        self._compiled_ok.add(name)

    def copy_target(self) -> None:
        for k, v in self.params.items():
            self.target[k].copy_(v)

    # --- the host's loop ------------------------------------------------------------------------------------

    def step(self, after_store: Callable[[], None] | None = None) -> None:
        """One env step of every member, its storage, target copy and (past ``learning_starts``) update;
        ``after_store`` is called after the transition is stored (probes: they see it in the replay buffer, where a
        single run's callbacks run just before the store)."""
        t, starts = self.num_timesteps, self.config["learning_starts"]
        self._phase("act", t < starts)
        self.num_timesteps = t = t + 1
        if after_store is not None:
            after_store()
        if t % self.config["target_update_interval"] == 0:
            self.copy_target()
        if t > starts:
            self._phase("update")
        if t - self._read_to == self.readback:
            self.read_back()

    def read_back(self) -> None:
        """Move the episodes finished since the last read-back into :attr:`episodes` (one host sync)."""
        first, last = self._read_to + 1, self.num_timesteps  # env steps 1.. (step s wrote row (s - 1) % readback)
        if last < first:
            return
        rows = [(s - 1) % self.readback for s in range(first, last + 1)]
        index = torch.as_tensor(rows, device=self.device)
        ends, returns, lengths = (a[index].cpu().numpy() for a in (self._ends, self._returns, self._lengths))
        for i, m in zip(*np.nonzero(ends)):
            self.episodes[m].append((first + int(i), float(returns[i, m]), int(lengths[i, m])))
        self._read_to = last
        self.diverged_at = self.diverged.cpu().numpy()
        self.diverged_loss_at = self.diverged_loss.cpu().numpy()

    def learn(self, steps: int) -> None:
        for _ in range(steps):
            self.step()
        self.read_back()

    def member_probe_context(self, m: int, model: nn.Module, rng: np.random.Generator) -> dict[str, Any]:
        """What a probe sees of member ``m`` (:meth:`agents.population.engine.Population.member_probe_context`):
        its network, the per-sample TD loss and ``sample(k)`` from its replay buffer, drawn with ``rng``."""
        model.load_state_dict(self.member_state(m))
        params = {**{k: v[m] for k, v in self.target.items()}, **{k: v[m] for k, v in self.buffers.items()}}

        def sample(k: int) -> tuple[Tensor, Tensor, Tensor]:
            size = int(self.size[m])
            if size == 0:
                raise RuntimeError("the replay buffer is empty; probe after learning_starts")
            idx = torch.as_tensor(rng.integers(0, size, size=k), device=self.device)
            with torch.no_grad():
                next_q = functional_call(self.base, (params,), (self.next_buf[m, idx].to(self.dtype),)).max(-1).values
                y = self.rew_buf[m, idx].to(self.dtype) + \
                    (1 - self.done_buf[m, idx].to(self.dtype)) * self.gamma * next_q
            return self.obs_buf[m, idx], self.act_buf[m, idx], y

        def td(q_net: nn.Module, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
            obs, actions, y = batch
            return (q_net(obs).gather(1, actions[:, None]).squeeze(1) - y) ** 2

        return {"model": model, "losses": {"td": td}, "sample": sample}

    def stored_observations(self, m: int, n: int, rng: np.random.Generator) -> Tensor | None:
        """``n`` distinct observations member ``m`` has stored (None until it has ``n``), chosen as the exact
        engine chooses them."""
        size = int(self.size[m])
        if size < n:
            return None
        return self.obs_buf[m, torch.as_tensor(np.sort(rng.choice(size, size=n, replace=False)), device=self.device)]

    def member_state(self, m: int) -> dict[str, Tensor]:
        """Member ``m``'s ``state_dict`` as SB3's Q-network names it (parameters and persistent buffers)."""
        keys = self.base.state_dict().keys()
        return {f"q_net.{k}": v[m].detach() for k, v in (*self.params.items(), *self.buffers.items()) if k in keys}
