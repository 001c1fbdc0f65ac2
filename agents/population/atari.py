"""P Atari DQN or Rainbow agents of one game trained in lockstep in one process, on ale-py's C++ vector env.

Each member is ``agents.train dqn --env ALE/... --set atari_env=ale-vector`` with its own seed, learning rate,
buffer size and epsilon schedule (:class:`agents.population.engine.Member`; the rest of the config is the
population's): the same Q-network built the same way (SB3's policy under ``set_random_seed(seed)``), the same game
(env ``m`` of one :class:`agents.rl.ale_vector.AtariGames` is seeded with member ``m``'s seed, as a single run's
one env), its own frame-deduplicated replay (:class:`agents.rl.frame_buffer.FrameReplayBuffer`, in host memory:
1e6 transitions are ~7.5 GB per member, and a sample is 32 x 4 frames gathered on the host and copied to the device
per update; with ``frames_on: device`` its frames are on the device and a sample is gathered there), its own
target network and Adam state, and SB3's loop order per env step (act, env step, store with the terminal
observation, target copy every ``target_update_interval`` steps, epsilon update, then one update after every
``train_freq`` steps once past ``learning_starts``). Loss: MSE on n-step returns as :class:`agents.rl.dqn.PaperDQN`
trains.

Implementations (:data:`IMPLEMENTATIONS`): ``"loop"`` runs each member's own ``QNetwork`` and ``torch.optim.Adam``,
the very kernels of SB3's DQN (a member equals its single run bit for bit: tests/test_population_atari.py);
``"vmap"`` stacks the members' parameters and runs one ``torch.func`` call of the network per step and per update
(convolutions batched over members as grouped convolutions) and one Adam step on the stacked tensors; ``"auto"``:
:func:`atari_implementation`. The two agree to float rounding (float64: 1e-10 after an update).

Rainbow members (a ``rainbow`` config; :mod:`agents.population.atari_rainbow`): each its own policy as its single
run builds it, prioritized frame replay, and noise drawn from its own torch generator, set to where the single run's
global torch stream stands when it starts training; every component of ``agents.rl.rainbow.Rainbow`` (noisy nets,
C51, PER, n-step returns, dueling, double Q): ``"loop"`` through Rainbow's own methods on each member's networks,
``"vmap"`` on the stacked networks (the noise in stacked buffers, C51's projection over members x samples).

Randomness is per member and is the single run's (:class:`SingleRunDraws`): a member draws its exploration coins,
random actions and replay indices from the very streams ``agents.train dqn`` draws them from for its seed (numpy's
global generator as ``set_random_seed(seed)`` leaves it, the action space seeded with ``seed``), so that, with
``"loop"``, **a member is the single run of its seed**, bit for bit, with nothing injected.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap
from torch.nn import functional as F

from agents.rl.ale_vector import AtariGames, AtariGamesVecEnv, game_name
from agents.rl.envs import is_atari
from agents.rl.evaluation import evaluate_games
from agents.rl.frame_buffer import FrameReplayBuffer, stacked_samples

from . import atari_rainbow as rainbow
from .engine import Member, _schedules
from .networks import member_policy, member_q_net

__all__ = ["AtariPopulation", "SingleRunDraws", "atari_implementation", "atari_refusal", "training_games",
           "IMPLEMENTATIONS"]

#: how the members' networks run: "vmap" (one torch.func call over stacked parameters), "loop" (each member's own
#: module and optimiser: SB3's kernels, its slow twin), "auto" ("loop" on a CPU, "vmap" on a GPU; module docstring)
IMPLEMENTATIONS = ("auto", "vmap", "loop")

OBS_SHAPE = (4, 84, 84)


def atari_refusal(config: Mapping[str, Any], device: str = "cpu", implementation: str = "auto") -> str | None:
    """Why the Atari population cannot train runs of the resolved dqn or rainbow ``config`` exactly as
    ``agents.train ALGO`` would, or None if it can."""
    rainbow = config.get("algo") == "rainbow"
    if not is_atari(str(config.get("env"))):
        return f"the Atari population runs Atari ids (ALE/...-v5), not {config.get('env')!r}"
    if config.get("atari_env") != "ale-vector":
        return ("the Atari population steps ale-py's C++ vector env; its members equal single runs with "
                "atari_env: ale-vector (got atari_env: {})".format(config.get("atari_env", "sb3")))
    wrong = {k: config.get(k) for k, ok in ((("td_loss", "mse"),) if not rainbow else ()) + (
                                             ("optimizer", "adam"), ("replay", "frames"),
                                             ("gradient_steps", 1), ("n_envs", 1), ("lr_schedule", "constant"),
                                             ("tau", 1.0), ("normalize_obs", False),
                                             ("normalize_reward", False), ("sb3_log", None))
             if config.get(k, ok) != ok}
    if not rainbow and config.get("max_grad_norm") is not None:
        wrong["max_grad_norm"] = config["max_grad_norm"]
    if int(config.get("learning_starts", 0)) < 1:  # (SB3's first action is then greedy at exploration_rate 0)
        return f"the Atari population needs learning_starts >= 1, got {config.get('learning_starts')}"
    if int(config["n_timesteps"]) % int(config.get("train_freq", 1)):
        return (f"n_timesteps ({config['n_timesteps']}) must be a multiple of train_freq ({config.get('train_freq')}): "
                "a single run trains on to the next multiple")
    if wrong or config.get("exploration_steps") is None:
        return ("the Atari population runs the authors' DQN and Rainbow: Adam, frame replay, one update per "
                "train_freq steps, one env per member, a constant learning rate, an exploration_steps schedule, "
                f"DQN's MSE TD loss without clipping; got {wrong or 'exploration_steps unset'}")
    if set(config.get("optimizer_kwargs") or {}) - {"betas", "eps", *(("fused", "foreach") if rainbow else ())}:
        return f"the Atari population's Adam takes betas and eps, not {sorted(config['optimizer_kwargs'])}"
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        return f"device {device!r}: this torch build or machine has no CUDA; use --device cpu"
    return None


def training_games(config: Mapping[str, Any], seeds: Sequence[int], num_threads: int = 0) -> AtariGamesVecEnv:
    """The training games of ``config``'s Atari id, env ``m`` seeded ``seeds[m]`` (a single run's one env is seeded
    the same way), as SB3's loop steps them; ``num_threads``: the C++ threads (0: one per game, at most the cores)."""
    return AtariGamesVecEnv(AtariGames(game_name(config["env"]), list(seeds), train=True,
                                       max_episode_steps=config.get("max_episode_steps") or 108_000,
                                       num_threads=num_threads))


def atari_implementation(implementation: str, device: str | torch.device) -> str:
    """The implementation ``implementation`` stands for on ``device``: ``auto`` is ``loop`` on a CPU (compute-bound:
    oneDNN's grouped convolutions and their backward are slower than one convolution per member;
    docs/agents/atari-populations.md, Speed) and ``vmap`` on a GPU (one kernel per layer for all members)."""
    return ("vmap" if torch.device(device).type == "cuda" else "loop") if implementation == "auto" else implementation


def _noise_generator(device: torch.device, seed: int) -> torch.Generator:
    """Where a single run's noise comes from when it starts training, as a generator of its own: on a CPU torch's
    global generator as the run's set-up left it (seeded, then the networks initialised; call right after building
    the member's policy), on a GPU the device's generator as ``set_random_seed(seed)`` seeded it (SB3 initialises
    the networks on the CPU, so nothing has drawn from it)."""
    if device.type == "cuda":
        return torch.Generator(device=device).manual_seed(int(seed))
    return torch.Generator().set_state(torch.get_rng_state())


class SingleRunDraws:
    """Each member's draws as ``agents.train dqn`` makes them for its seed: epsilon's coin ``np.random.rand()`` and
    replay indices ``np.random.randint(0, size, k)`` from numpy's global generator as SB3's ``set_random_seed(seed)``
    leaves it (network initialisation draws from torch's), random actions from the action space seeded with
    ``seed``; here one ``RandomState`` and one space per member. The interface of
    :class:`agents.population.engine.Draws`."""

    def __init__(self, seeds: Sequence[int], n_actions: int) -> None:
        self.states = [np.random.RandomState(int(s)) for s in seeds]
        self.spaces = [spaces.Discrete(n_actions) for _ in seeds]
        for space, s in zip(self.spaces, seeds):
            space.seed(int(s))

    def explore(self, m: int) -> float:
        return float(self.states[m].rand())

    def action(self, m: int) -> int:
        return int(self.spaces[m].sample())

    def all_indices(self, sizes: np.ndarray, k: int) -> np.ndarray:
        return np.stack([rs.randint(0, int(n), size=k) for rs, n in zip(self.states, sizes)])


class _FloatQ(nn.Module):
    """A QNetwork's modules on float observations (SB3's ``preprocess_obs`` casts to float32; a float64 twin keeps
    float64): the same parameter names as the QNetwork's ``state_dict``."""

    def __init__(self, q: nn.Module) -> None:
        super().__init__()
        self.features_extractor, self.q_net = q.features_extractor, q.q_net

    def forward(self, x: Tensor) -> Tensor:
        return self.q_net(self.features_extractor(x))


def _adam(params: Sequence[Tensor], grads: Sequence[Tensor], exp_avgs: Sequence[Tensor],
          exp_avg_sqs: Sequence[Tensor], step: int, lr: Tensor, betas: tuple[float, float], eps: float) -> None:
    """torch's Adam step (single-tensor form, no weight decay, no amsgrad) in place on stacked parameters, ``lr``
    ``(P,)`` per member, ``step`` the step count after this step."""
    beta1, beta2 = betas
    bias1, bias2_sqrt = 1 - beta1 ** step, (1 - beta2 ** step) ** 0.5
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v.sqrt() / bias2_sqrt).add_(eps)
        p.add_(-(lr / bias1).view(-1, *([1] * (p.dim() - 1))) * m / denom)


class AtariPopulation:
    """The members of ``members`` on ``config`` (a resolved ``dqn`` or ``rainbow`` config of an Atari id with
    ``atari_env: ale-vector``; its seed, learning rate, buffer size and epsilon schedule are the members').

    ``nets``: initial Q-networks per member (DQN; default :func:`member_q_net`; float64 ones for the twin tests);
    ``draws``: the members' randomness (default :class:`SingleRunDraws`); ``dtype``: the Rainbow networks' (float64
    for the twin tests; default float32); ``num_threads``: the vector env's C++ threads
    (0: one per game, at most the machine's cores); ``games``: a vector env whose games an owner steps for several
    populations (:class:`agents.population.atari_groups.AtariGroups`; this one then neither resets nor steps it).
    """

    def __init__(self, config: Mapping[str, Any], members: Sequence[Member], *, device: str = "cpu",
                 nets: Sequence[nn.Module] | None = None, draws: Any = None, implementation: str = "auto",
                 num_threads: int = 0, dtype: torch.dtype | None = None,
                 games: AtariGamesVecEnv | None = None) -> None:
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
        if not members:
            raise ValueError("a population needs at least one member")
        if (why := atari_refusal(config, device, implementation)) is not None:
            raise ValueError(why)
        self.config, self.members, self.device = dict(config), list(members), torch.device(device)
        self.P = len(members)
        self.rainbow = config.get("algo") == "rainbow"
        self.implementation = atari_implementation(implementation, device)
        if self.rainbow:  # each member's policy as its single run builds it; its noise from the run's torch stream
            if nets is not None:
                raise ValueError("a Rainbow population builds its members' policies itself; nets= is for DQN")
            policies, self.noise = [], []
            for m in members:
                policies.append(member_policy(config, m.seed, m.learning_rate).to(self.device, dtype))
                self.noise.append(_noise_generator(self.device, m.seed))
            nets = [p.q_net for p in policies]
        nets = list(nets) if nets is not None else [member_q_net(config, m.seed) for m in members]
        self.nets = [n.to(self.device) for n in nets]
        self.dtype = next(self.nets[0].parameters()).dtype
        self.lr = torch.tensor([m.learning_rate for m in members], dtype=self.dtype, device=self.device)
        opt = dict(config.get("optimizer_kwargs") or {})
        self.betas, self.adam_eps = tuple(opt.get("betas", (0.9, 0.999))), float(opt.get("eps", 1e-8))
        if self.rainbow and self.implementation == "vmap":
            self.base, self.stacked = self.nets[0], rainbow.Stacked(policies, self.device)
            self.nets = []  # (the stacked tensors are the members' networks now)
        elif self.rainbow:
            self.base = self.nets[0]
            self.targets, self.optimizers = [p.q_net_target for p in policies], [p.optimizer for p in policies]
        elif self.implementation == "loop":  # each member's module, target and optimiser, as SB3 holds them
            self.base = self.nets[0]  # (what a run log's example context shows where there are no probes)
            self.targets = [copy.deepcopy(n) for n in self.nets]
            for t in self.targets:
                t.train(False)
            self.optimizers = [torch.optim.Adam(n.parameters(), lr=m.learning_rate, betas=self.betas,
                                                eps=self.adam_eps) for n, m in zip(self.nets, members)]
        else:
            self.base = copy.deepcopy(_FloatQ(self.nets[0]))  # (its own tensors are replaced in every call)
            params, self.buffers = stack_module_state([_FloatQ(n) for n in self.nets])
            self.params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
            self.target = {k: v.detach().clone() for k, v in self.params.items()}
            self.exp_avg = {k: torch.zeros_like(v) for k, v in self.params.items()}
            self.exp_avg_sq = {k: torch.zeros_like(v) for k, v in self.params.items()}
            self.nets = []  # (the stacked tensors are the members' networks now)
        self.adam_steps = 0
        self.eps_initial, self.eps_final, self.eps_steps = _schedules(config, members)
        self.env = games if games is not None else training_games(config, [m.seed for m in members], num_threads)
        self.n_actions = int(self.env.action_space.n)
        self.draws = draws if draws is not None else SingleRunDraws([m.seed for m in members], self.n_actions)
        obs_space = spaces.Box(0, 255, OBS_SHAPE, np.uint8)
        replay, extra = FrameReplayBuffer, {}
        if self.rainbow and config.get("prioritized"):
            from agents.rl.rainbow import PrioritizedFrameReplayBuffer

            replay, extra = PrioritizedFrameReplayBuffer, {"alpha": config["per_alpha"], "eps": config["per_eps"]}
        self.replay = [replay(m.buffer_size, obs_space, self.env.action_space, device=self.device, n_envs=1,
                              n_steps=int(config.get("n_steps", 1)), gamma=float(config["gamma"]),
                              frames_on=config.get("frames_on", "host"), **extra) for m in members]
        self.obs = self.env.reset() if games is None else None  # (shared games: the owner steps them, sets obs)
        self.num_timesteps = 0
        self.episodes: list[list[tuple[int, float, int]]] = [[] for _ in range(self.P)]  # (step, return, length)
        self.last_losses: Tensor | None = None
        self.seconds = {"acting": 0.0, "env": 0.0, "store": 0.0, "update": 0.0}
        self.diverged = np.zeros(self.P, dtype=np.int64)

    @property
    def diverged_at(self) -> np.ndarray:
        return self.diverged

    def __getstate__(self) -> dict[str, Any]:  # (torch generators do not pickle: their states do)
        state = dict(self.__dict__)
        if "noise" in state:
            state["noise"] = [g.get_state() for g in state["noise"]]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "noise" in state:
            state["noise"] = [torch.Generator(device=state["device"]).set_state(g) for g in state["noise"]]
        self.__dict__.update(state)

    # --- network ----------------------------------------------------------------------------------------

    def q_values(self, obs: Tensor, params: Mapping[str, Tensor] | None = None) -> Tensor:
        """``(P, B, actions)`` Q-values of ``obs`` ``(P, B, 4, 84, 84)`` (uint8 or float), member ``m`` on its own
        network (``params``: stacked parameters, default the online ones; "vmap" only)."""
        if self.rainbow and self.implementation == "vmap":
            return self.stacked(obs, "q")
        if self.rainbow:  # (its forward casts observations as SB3's preprocessing does)
            return torch.stack([net(obs[m]) for m, net in enumerate(self.nets)])
        x = obs.to(self.dtype)
        if self.implementation == "loop":
            nets = self.nets if params is None else params
            return torch.stack([net.q_net(net.features_extractor(x[m])) for m, net in enumerate(nets)])
        params = self.params if params is None else params
        return vmap(lambda p, b, xm: functional_call(self.base, (p, b), (xm,)))(params, self.buffers, x)

    # --- the loop ---------------------------------------------------------------------------------------

    def epsilon(self, t: int) -> np.ndarray:
        """The members' exploration rates ``(P,)`` after ``t`` env steps (``agents.rl.dqn.PaperDQN.epsilon``)."""
        frac = np.clip((t - self.config["learning_starts"]) / np.maximum(self.eps_steps, 1), 0.0, 1.0)
        frac = np.where(self.eps_steps == 0, 1.0, frac)
        return self.eps_initial + frac * (self.eps_final - self.eps_initial)

    def greedy(self, obs: np.ndarray, members: Sequence[int] | None = None) -> np.ndarray:
        """Each member's greedy action ``(P,)`` for its observation ``obs`` ``(P, 4, 84, 84)``; with ``members``, one
        network call for those alone where each member's network is its own (``loop``; the others' actions -1)."""
        x = torch.as_tensor(obs, device=self.device)[:, None]
        with torch.no_grad():
            if members is None or self.implementation != "loop":
                return self.q_values(x).argmax(-1)[:, 0].cpu().numpy()
            out = np.full(self.P, -1, dtype=np.int64)
            for m in members:
                net = self.nets[m]
                q = net(x[m]) if self.rainbow else net.q_net(net.features_extractor(x[m].to(self.dtype)))
                out[m] = int(q.argmax(-1)[0])
            return out

    def act(self) -> np.ndarray:
        """The members' actions ``(P,)`` for their current observations (SB3's ``_sample_action``)."""
        t0 = time.perf_counter()
        actions = self._actions()
        self.seconds["acting"] += time.perf_counter() - t0
        return actions

    def _actions(self) -> np.ndarray:
        t = self.num_timesteps
        if t < self.config["learning_starts"]:
            return np.array([self.draws.action(m) for m in range(self.P)])
        eps = self.epsilon(t)
        if self.rainbow:  # fresh noise before every action (Rainbow.predict), from each member's torch stream
            for m in range(self.P):
                rainbow.set_noise(self, m, "online", resample=True)
        coins = [self.draws.explore(m) < eps[m] for m in range(self.P)]
        exploit = [m for m in range(self.P) if not coins[m]]  # (SB3 calls the network only for those)
        greedy = self.greedy(self.obs, exploit) if exploit else None
        return np.array([self.draws.action(m) if coins[m] else greedy[m] for m in range(self.P)])

    def step(self, before_store: Callable[[], None] | None = None) -> None:
        """One env step of every member, its storage, target copy and (every ``train_freq`` steps past
        ``learning_starts``) update; ``before_store`` is called where SB3 calls a callback's ``on_step``."""
        actions = self.act()
        t1 = time.perf_counter()
        obs, rewards, dones, infos = self.env.step(actions)
        self.seconds["env"] += time.perf_counter() - t1
        self.num_timesteps += 1
        if before_store is not None:
            before_store()
        self.observe(actions, obs, rewards, dones, infos)

    def observe(self, actions: np.ndarray, obs: np.ndarray, rewards: np.ndarray, dones: np.ndarray,
                infos: Sequence[dict[str, Any]]) -> None:
        """The rest of an env step after the env stepped (``num_timesteps`` counted already): each member's transition
        stored, the target copy and the update where due."""
        t2 = time.perf_counter()
        for m, buf in enumerate(self.replay):  # SB3's _store_transition: a finished episode's own last stack
            nxt = infos[m]["terminal_observation"] if dones[m] else obs[m]
            buf.add(self.obs[m][None], nxt[None], actions[m:m + 1], rewards[m:m + 1], dones[m:m + 1], [infos[m]])
            if "episode" in infos[m]:  # a game over: its raw score (training episodes end at lost lives)
                self.episodes[m].append((self.num_timesteps, infos[m]["episode"]["r"], infos[m]["episode"]["l"]))
        self.obs = obs
        t3 = time.perf_counter()
        self.seconds["store"] += t3 - t2
        if self.num_timesteps % self.config["target_update_interval"] == 0:
            self._copy_target()
        if self.num_timesteps % self.config["train_freq"] == 0 and self.num_timesteps > self.config["learning_starts"]:
            self.update()
            self.seconds["update"] += time.perf_counter() - t3

    def _copy_target(self) -> None:
        """SB3's target copy (``polyak_update`` with tau 1): the parameters, not the buffers."""
        if self.implementation == "loop":
            with torch.no_grad():
                for net, target in zip(self.nets, self.targets):
                    for p, q in zip(net.parameters(), target.parameters()):
                        q.copy_(p)
        elif self.rainbow:
            self.stacked.copy_target()
        else:
            self.target = {k: v.detach().clone() for k, v in self.params.items()}

    def sample(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Every member's replay sample, drawn with its own generator, copied to the device once per field: obs and
        next obs ``(P, batch, 4, 84, 84)`` uint8, actions ``(P, batch)`` int64, returns, terminations, discounts."""
        k = int(self.config["batch_size"])
        idx = self.draws.all_indices(np.array([buf.size() for buf in self.replay]), k)
        parts = [buf.sample_arrays(buf.rows(idx[m])) for m, buf in enumerate(self.replay)]  # (host arrays)
        return stacked_samples(self.replay, parts, self.device, float(self.config["gamma"]))

    def update(self) -> Tensor:
        """One Adam step of every member on its own replay sample; the members' losses ``(P,)``."""
        if self.rainbow:
            return rainbow.update(self)
        obs, act, nxt, rew, done, disc = self.sample()
        if self.implementation == "loop":
            return self._update_loop(obs, act, nxt, rew, done, disc)
        with torch.no_grad():
            y = rew.to(self.dtype) + (1 - done.to(self.dtype)) * disc.to(self.dtype) * \
                self.q_values(nxt, self.target).max(-1).values
        q = self.q_values(obs).gather(-1, act[..., None])[..., 0]
        losses = ((q - y) ** 2).mean(-1)
        grads = torch.autograd.grad(losses.sum(), list(self.params.values()))
        finite = self._finite(losses)
        if not bool(finite.all()):
            grads = [torch.where(finite.view(-1, *([1] * (g.dim() - 1))), g, torch.zeros_like(g)) for g in grads]
        self.adam_steps += 1
        with torch.no_grad():
            _adam(list(self.params.values()), grads, list(self.exp_avg.values()), list(self.exp_avg_sq.values()),
                  self.adam_steps, self.lr, self.betas, self.adam_eps)
        self.last_losses = losses.detach()
        return self.last_losses

    def _update_loop(self, obs: Tensor, act: Tensor, nxt: Tensor, rew: Tensor, done: Tensor, disc: Tensor) -> Tensor:
        """PaperDQN.train's kernels, member by member (SB3's shapes: ``(batch, 1)`` columns)."""
        losses = []
        for m, (net, target, opt) in enumerate(zip(self.nets, self.targets, self.optimizers)):
            net.train(True)
            with torch.no_grad():
                next_q = target.q_net(target.features_extractor(nxt[m].to(self.dtype))).max(dim=1).values
                y = rew[m][:, None] + (1 - done[m][:, None]) * disc[m][:, None] * next_q.reshape(-1, 1)
            q = torch.gather(net.q_net(net.features_extractor(obs[m].to(self.dtype))), dim=1, index=act[m][:, None])
            loss = F.mse_loss(q, y.to(self.dtype))
            losses.append(loss.detach())
            if self.diverged[m] or not bool(torch.isfinite(loss)):  # (a member stops at its first non-finite loss)
                continue
            opt.zero_grad()
            loss.backward()
            opt.step()
        self.last_losses = torch.stack(losses)
        self._finite(self.last_losses)
        self.adam_steps += 1
        return self.last_losses

    def _finite(self, losses: Tensor) -> Tensor:
        """Which members' losses ``(P,)`` are finite; members with a first non-finite one stop here, as a run stops
        (:attr:`diverged` holds the step, the learning rate becomes 0)."""
        finite = torch.isfinite(losses)
        if not bool(finite.all()):
            for m in torch.nonzero(~finite).flatten().tolist():
                self.diverged[m] = self.diverged[m] or self.num_timesteps
            self.lr = torch.where(finite, self.lr, torch.zeros_like(self.lr))
        return finite

    # --- members as single runs ---------------------------------------------------------------------------

    def member_state(self, m: int) -> dict[str, Tensor]:
        """Member ``m``'s ``QNetwork`` ``state_dict`` (parameters and persistent buffers, SB3's names)."""
        if self.rainbow and self.implementation == "vmap":
            return self.stacked.member_state(m)
        if self.implementation == "loop":
            return {k: v.detach() for k, v in self.nets[m].state_dict().items()}
        return {k: v[m].detach() for k, v in (*self.params.items(), *self.buffers.items())}

    def _target_state(self, m: int) -> dict[str, Tensor]:
        if self.rainbow and self.implementation == "vmap":
            return self.stacked.member_state(m, "target")
        if self.implementation == "loop":
            return self.targets[m].state_dict()
        return {**{k: v[m] for k, v in self.target.items()}, **{k: v[m] for k, v in self.buffers.items()}}

    def member_probe_context(self, m: int, model: nn.Module, rng: np.random.Generator) -> dict[str, Any]:
        """What a probe sees of member ``m`` (:func:`probes.sb3.dqn_context` of a single run): ``model`` (a
        ``QNetwork``, loaded here with the member's weights), the per-sample TD loss on n-step returns and
        ``sample(k)`` from its replay with the probe's ``rng``, targets from its target network (a copy of ``model``
        loaded with the target's weights)."""
        from probes.sb3 import dqn_context

        model.load_state_dict(self.member_state(m))
        target = copy.deepcopy(model)
        target.load_state_dict(self._target_state(m))
        if self.rainbow:
            from agents.rl.rainbow import rainbow_context

            return rainbow_context(rainbow.RainbowView(self.config, model, target, self.replay[m],
                                                       self.members[m].seed, self.device), rng)
        algo = SimpleNamespace(td_loss="mse", q_net=model, q_net_target=target, gamma=float(self.config["gamma"]),
                               replay_buffer=self.replay[m], _vec_normalize_env=None)
        return dqn_context(algo, rng)

    def stored_observations(self, m: int, n: int, rng: np.random.Generator) -> Tensor | None:
        """``n`` distinct observations ``(n, 4, 84, 84)`` uint8 member ``m`` has stored (None until it has ``n``),
        chosen as :class:`probes.sb3.ProbeCallback` chooses a run's fixed probe inputs."""
        buf = self.replay[m]
        if buf.size() < n:
            return None
        rows = buf.rows(np.sort(rng.choice(buf.size(), size=n, replace=False)))
        return torch.as_tensor(buf.stacks(buf.obs_head[rows, 0]), device=self.device)

    def evaluate(self, seeds: Sequence[int], episodes: int) -> list[list[tuple[float, int]]]:
        """Each member's first ``episodes`` greedy whole games (raw score, agent steps) on a fresh test env seeded
        ``seeds[m]`` (no episodic life, no reward clipping: the authors' test protocol, as
        :class:`agents.rl.evaluation.EvalCallback` runs a single run's); draws nothing from the training's
        generators."""
        self.evaluation_mode()
        return evaluate_games(self.config, seeds, episodes, self.greedy)

    def evaluation_mode(self) -> None:
        """Rainbow members act greedily on their mean weights (``Rainbow.predict``, deterministic) until the next
        training action redraws their noise; DQN members have nothing to switch."""
        for m in range(self.P if self.rainbow else 0):
            rainbow.set_noise(self, m, "online", on=False)

    def learn(self, steps: int, on_step: Callable[[AtariPopulation], None] | None = None) -> None:
        for _ in range(steps):
            self.step()
            if on_step is not None:
                on_step(self)

