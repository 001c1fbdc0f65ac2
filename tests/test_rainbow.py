"""Rainbow's components against slow, obviously correct twins: the C51 projection (a per-atom loop), the
sum tree (chi-square on sampling frequencies, exact intervals), importance weights (the formula on the whole
buffer), n-step returns at terminations and truncations (by hand), the noisy layer's noise statistics, the dueling
aggregation and double-Q target selection; then the agent through the CLI and the probes' view of its noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces
from scipy import stats
from torch import nn

from agents.rl.rainbow import PrioritizedReplayBuffer, Rainbow, RainbowPolicy, SumTree, project
from interference.noisy import NoisyLinear, resample_noise, set_noise


# --- C51 projection -------------------------------------------------------------------------------------


def project_per_atom(probs, rewards, discounts, support):
    """The C51 paper's Algorithm 1, one atom at a time, in float64."""
    probs, rewards, discounts, support = (t.double() for t in (probs, rewards, discounts, support))
    k = len(support)
    v_min, v_max = support[0].item(), support[-1].item()
    dz = (v_max - v_min) / (k - 1)
    out = torch.zeros_like(probs)
    for i in range(probs.shape[0]):
        for j in range(k):
            tz = min(max(rewards[i].item() + discounts[i].item() * support[j].item(), v_min), v_max)
            b = (tz - v_min) / dz
            lo, hi = math.floor(b), math.ceil(b)
            if lo == hi:
                out[i, lo] += probs[i, j]
            else:
                out[i, lo] += probs[i, j] * (hi - b)
                out[i, hi] += probs[i, j] * (b - lo)
    return out


@pytest.mark.parametrize("k, v", [(51, 10.0), (5, 1.0), (2, 3.0)])
def test_c51_projection_equals_the_per_atom_loop(k, v):
    g = torch.Generator().manual_seed(k)
    support = torch.linspace(-v, v, k, dtype=torch.float64)
    probs = torch.softmax(torch.randn(12, k, generator=g, dtype=torch.float64), dim=1)
    rewards = torch.randn(12, generator=g, dtype=torch.float64) * v
    rewards[0], rewards[1] = 100 * v, -100 * v  # everything clipped to one end
    discounts = torch.full((12,), 0.97, dtype=torch.float64) ** 3
    discounts[2] = 0.0  # terminal: all mass on the reward
    discounts[3], rewards[3] = 1.0, 0.0  # identity: atoms land exactly on atoms
    got = project(probs, rewards, discounts, support)
    assert torch.allclose(got, project_per_atom(probs, rewards, discounts, support), atol=1e-12)
    assert torch.allclose(got.sum(1), torch.ones(12, dtype=torch.float64))
    assert torch.allclose(got[3], probs[3])


# --- sum tree and importance weights --------------------------------------------------------------------


def test_sum_tree_samples_in_proportion_to_priority():
    rng = np.random.default_rng(0)
    tree = SumTree(37)  # not a power of two: padding leaves must never be drawn
    priority = rng.uniform(0.0, 2.0, 37) ** 3
    priority[[4, 30]] = 0.0  # zero priority: never drawn
    tree.update(np.arange(37), priority)
    assert tree.total == pytest.approx(priority.sum())
    assert tree.min() == pytest.approx(priority[priority > 0].min())
    counts = np.bincount(np.concatenate([tree.sample(64, rng) for _ in range(4000)]), minlength=64)
    assert counts[37:].sum() == 0 and counts[[4, 30]].sum() == 0
    expected = 64 * 4000 * priority / priority.sum()
    keep = expected > 0
    chi2 = ((counts[:37][keep] - expected[keep]) ** 2 / expected[keep]).sum()
    assert stats.chi2.sf(chi2, keep.sum() - 1) > 1e-3, chi2


def test_sum_tree_finds_the_exact_interval_and_updates_repeated_slots():
    tree = SumTree(5)
    tree.update(np.array([0, 1, 2, 3, 4, 2]), np.array([1.0, 2.0, 9.0, 3.0, 4.0, 0.5]))  # slot 2: later wins
    edges = np.cumsum([0, 1.0, 2.0, 0.5, 3.0, 4.0])
    for slot in range(5):
        lo, hi = edges[slot], edges[slot + 1]
        assert list(tree.find(np.array([lo, (lo + hi) / 2, np.nextafter(hi, 0)]))) == [slot] * 3
    assert tree.total == pytest.approx(10.5) and tree.min() == 0.5
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([np.nan]))


def _buffer(n: int = 10, **kw) -> PrioritizedReplayBuffer:
    return PrioritizedReplayBuffer(n, spaces.Box(-1e9, 1e9, (1,)), spaces.Discrete(2), "cpu", **kw)


def _fill(buf, rewards, dones=None, truncs=None):
    dones = dones or [False] * len(rewards)
    truncs = truncs or [False] * len(rewards)
    for t, (r, d, tr) in enumerate(zip(rewards, dones, truncs)):
        buf.add(np.array([[t]]), np.array([[100 + t]]), np.array([[0]]), np.array([r]), np.array([d or tr]),
                [{"TimeLimit.truncated": tr}])


def test_importance_weights_follow_the_formula_on_the_whole_buffer():
    buf = _buffer(8, alpha=0.7, eps=0.01)
    _fill(buf, [0.0] * 6)
    losses = np.array([0.5, 2.0, 0.1, 1.0, 3.0, 0.0])
    buf.update_priorities(np.arange(6), losses)
    p = (np.abs(losses) + 0.01) ** 0.7
    assert np.allclose(buf.tree[np.arange(6)], p)
    np.random.seed(0)
    _, slots, weights = buf.sample_prioritized(32, beta=0.6)
    P = p / p.sum()
    naive = (6 * P) ** -0.6 / ((6 * P) ** -0.6).max()
    assert np.allclose(weights, naive[slots], rtol=1e-5)
    _fill(buf, [0.0])  # a new transition gets the largest priority seen
    assert buf.tree[np.array([6])][0] == pytest.approx((3.0 + 0.01) ** 0.7)


def test_prioritized_samples_are_normalised_like_uniform_ones():
    """With VecNormalize (normalize_obs / normalize_reward) the prioritized path normalises as SB3's sample does."""

    class Normalise:
        def normalize_obs(self, obs):
            return obs * 2.0

        def normalize_reward(self, reward):
            return reward * 3.0

    buf = _buffer(8)
    _fill(buf, [1.0, 2.0, 4.0])
    np.random.seed(1)
    samples, slots, _ = buf.sample_prioritized(16, beta=0.4, env=Normalise())
    assert torch.equal(samples.observations.flatten(), torch.as_tensor(2.0 * slots, dtype=torch.float32))
    assert torch.equal(samples.rewards.flatten(), torch.as_tensor([3.0 * [1.0, 2.0, 4.0][s] for s in slots]))


def test_without_c51_priorities_follow_the_absolute_td_error():
    """PER's priority is |delta| (then ^alpha), not the squared TD loss."""
    from agents.rl.rainbow import Batch

    algo = Rainbow.__new__(Rainbow)
    algo.distributional = False
    batch = Batch(torch.zeros(3, 3), torch.tensor([0, 1, 0]), torch.tensor([1.0, 3.0, 9.0]))
    q = _FixedQ([[2.0, 0.0], [0.0, 1.0], [5.0, 0.0]])
    for loss, expected in (("mse", [1.0, 4.0, 16.0]), ("huber", [0.5, 1.5, 3.5])):
        algo.td_loss = loss
        values, priority = algo._losses(q, batch)
        assert values.tolist() == expected and priority.tolist() == [1.0, 2.0, 4.0]


# --- n-step returns -------------------------------------------------------------------------------------


def test_n_step_returns_at_terminations_and_truncations():
    """gamma 0.5, n 3; an episode terminates at t=2, the next is truncated at t=5 (inside the window of t=4), the
    last runs on. By hand: reward sums, the bootstrap discount gamma^k and its state, done only at termination."""
    buf = _buffer(20, n_steps=3, gamma=0.5)
    rewards = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0]
    _fill(buf, rewards, dones=[False, False, True, False, False, False, False, False, False, False],
          truncs=[False, False, False, False, False, True, False, False, False, False])
    hand = {  # t: (n-step return, discount, next obs (100 + last t), done)
        0: (1 + 0.5 * 2 + 0.25 * 4, 0.125, 102, 1.0),
        1: (2 + 0.5 * 4, 0.25, 102, 1.0),
        2: (4.0, 0.5, 102, 1.0),  # the terminal transition itself
        3: (8 + 0.5 * 16 + 0.25 * 32, 0.125, 105, 0.0),  # truncated at t=5: bootstrap from where it was cut
        4: (16 + 0.5 * 32, 0.25, 105, 0.0),
        5: (32.0, 0.5, 105, 0.0),
        6: (64 + 0.5 * 128 + 0.25 * 256, 0.125, 108, 0.0),
        8: (256 + 0.5 * 512, 0.25, 109, 0.0),  # the newest transition ends the window (nothing after it yet)
    }
    for t, (ret, disc, nxt, done) in hand.items():
        s = buf._get_samples(np.array([t]))
        assert s.rewards.item() == pytest.approx(ret), t
        assert s.discounts.item() == pytest.approx(disc), t
        assert s.next_observations.item() == nxt and s.dones.item() == done, t


# --- noisy layers ---------------------------------------------------------------------------------------


def test_noisy_layer_noise_statistics_and_modes():
    torch.manual_seed(0)
    layer = NoisyLinear(40, 30, std_init=0.5)
    draws = []
    for _ in range(400):
        layer.resample()
        draws.append(torch.outer(layer.eps_out, layer.eps_in))
    eps = torch.stack(draws)
    # f(e) = sign(e) sqrt|e|: E f = 0, E f^2 = E|e| = sqrt(2/pi); a weight's noise f(e_i) f(e_j) has variance 2/pi
    assert abs(eps.mean().item()) < 0.01
    assert eps.var().item() == pytest.approx(2 / math.pi, rel=0.03)
    assert torch.allclose(layer.weight_sigma, torch.full((30, 40), 0.5 / math.sqrt(40)))
    x = torch.randn(5, 40)
    noisy = x @ (layer.weight_mu + layer.weight_sigma * torch.outer(layer.eps_out, layer.eps_in)).T
    noisy = noisy + layer.bias_mu + layer.bias_sigma * layer.eps_out
    assert torch.allclose(layer(x), noisy, atol=1e-6)
    set_noise(layer, False)
    assert torch.allclose(layer(x), x @ layer.weight_mu.T + layer.bias_mu)


# --- the network: dueling, double Q ---------------------------------------------------------------------


def _policy(**kw) -> RainbowPolicy:
    obs, act = spaces.Box(-1, 1, (3,)), spaces.Discrete(4)
    return RainbowPolicy(obs, act, lambda _: 1e-3, net_arch=[8], activation="elephant", **kw)


@pytest.mark.parametrize("atoms", [1, 7])
def test_dueling_aggregation(atoms):
    torch.manual_seed(1)
    net = _policy(n_atoms=atoms, v_min=-1.0, v_max=1.0).q_net
    set_noise(net, False)
    x = torch.randn(6, 3)
    v = net.value(x).view(6, 1, atoms)
    a = net.advantage(x).view(6, 4, atoms)
    by_hand = v + a - a.mean(dim=1, keepdim=True)
    assert torch.allclose(net.logits(x), by_hand, atol=1e-6)
    q = net(x)
    if atoms == 1:
        assert torch.allclose(q, by_hand.squeeze(-1), atol=1e-6)
    else:
        assert torch.allclose(q, (torch.softmax(by_hand, -1) * torch.linspace(-1, 1, atoms)).sum(-1), atol=1e-6)
        assert torch.allclose(net.log_probs(x).exp().sum(-1), torch.ones(6, 4))


class _FixedQ(nn.Module):
    """A Q-network returning fixed Q-values ``table`` (and their one-atom 'distribution')."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.as_tensor(table, dtype=torch.float32)

    def forward(self, obs):
        return self.table[: len(obs)]


def test_double_q_target_selection():
    """Online net prefers action 0, target net action 1: double Q bootstraps from Q_target(s', 0)."""
    from stable_baselines3.common.type_aliases import ReplayBufferSamples

    data = ReplayBufferSamples(torch.zeros(2, 3), torch.zeros(2, 1), torch.zeros(2, 3), torch.tensor([[0.0], [1.0]]),
                               torch.tensor([[1.0], [2.0]]), torch.tensor([[0.5], [0.5]]))
    online, target = _FixedQ([[5.0, 1.0], [5.0, 1.0]]), _FixedQ([[2.0, 9.0], [2.0, 9.0]])
    for double, expected in ((True, [1 + 0.5 * 2, 2.0]), (False, [1 + 0.5 * 9, 2.0])):
        algo = Rainbow.__new__(Rainbow)  # only the target arithmetic: no env, no networks of its own
        algo.double_q, algo.distributional, algo.gamma = double, False, 0.99
        batch = algo.batch(data, online, target)
        assert batch.targets.tolist() == expected


# --- the agent ------------------------------------------------------------------------------------------


def _run(tmp_path, env="CartPole-v1", steps=600, **flags):
    from agents.commands import get_command
    from agents.rl.run import train

    cmd = get_command("rainbow")
    config = cmd.make_config({"env": env, "steps": steps, "set": [f"{k}={v}" for k, v in flags.items()],
                              "probe": "gradcov,ntk,plasticity", "probe_every": steps // 3, "probe_inputs": 8,
                              "checkpoint_every": 0, "progress": False})
    run_dir = cmd.run_dir(config, tmp_path)
    return config, run_dir, train(config, run_dir)


def test_rainbow_runs_probed_and_with_everything_off(tmp_path):
    from runlog import read_run

    config, run_dir, summary = _run(tmp_path, learning_starts=100, hidden=16)
    assert summary["status"] == "finished"
    run = read_run(run_dir / "run.h5")
    assert run.config["probe_noise"] == "mean" and run.config["noisy"] is True
    assert {"gradcov", "ntk", "plasticity"} <= set(run.probes)
    off = dict(noisy="false", distributional="false", prioritized="false", dueling="false", double_q="false",
               n_steps=1, learning_starts=100)
    _, run_dir, summary = _run(tmp_path / "off", **off)
    assert summary["status"] == "finished"
    from stable_baselines3.common.buffers import ReplayBuffer
    from agents.rl.algos import ALGOS

    model = ALGOS["rainbow"].model.load(run_dir / "model.zip")
    assert not any(isinstance(m, NoisyLinear) for m in model.q_net.modules())
    assert model.q_net.value is None and model.q_net.n_atoms == 1


def test_probes_see_the_mean_network_or_one_fixed_sample():
    from agents.rl.rainbow import rainbow_context
    from stable_baselines3.common.env_util import make_vec_env

    algo = Rainbow(RainbowPolicy, make_vec_env("CartPole-v1", n_envs=1, seed=0), learning_starts=10, seed=3,
                   policy_kwargs={"net_arch": [8]}, probe_noise="fixed")
    algo.learn(40)
    x = torch.randn(5, 4)
    rng = np.random.default_rng(0)
    first = rainbow_context(algo, rng)["model"](x).detach()
    resample_noise(algo.q_net)  # training moves on ...
    assert torch.equal(rainbow_context(algo, rng)["model"](x).detach(), first)  # ... the probes' sample does not
    algo.probe_noise = "mean"
    mean = rainbow_context(algo, rng)["model"](x).detach()
    set_noise(algo.q_net, False)
    assert torch.equal(mean, algo.q_net(x).detach()) and not torch.equal(mean, first)


# --- MinAtar ----------------------------------------------------------------------------------------------


def test_minatar_envs_and_both_agents_with_the_report(tmp_path):
    """MinAtar's boolean (10, 10, C) grids through DQN (SB3, our conv extractor) and Rainbow, then the MinAtar
    report: learning curves, the table with the random baseline, the sensitivity figure."""
    from agents.commands import get_command
    from agents.rl.envs import env_spaces
    from agents.rl.run import train
    from reports.minatar import main as report

    obs, act = env_spaces("MinAtar/Breakout-v1")
    assert obs.shape == (10, 10, 4) and obs.dtype == bool and act.n == 3  # v1: the minimal action set
    runs = [("dqn", "elephant", {}, 0), ("dqn", "elephant", {}, 1), ("dqn", "relu", {}, 0), ("dqn", "relu", {}, 1),
            ("dqn", "elephant", {"a": 0.4}, 0), ("rainbow", "elephant", {}, 0),
            ("dqn", "relu", {"learning_starts": 300}, 0)]  # never updates: the random baseline
    for algo, activation, extra, seed in runs:
        cmd = get_command(algo)
        config = cmd.make_config({"env": "MinAtar/Breakout-v1", "act": activation, "steps": 300, "seed": seed,
                                  "learning_starts": 100, "exploration_steps": 100, "buffer_size": 1000,
                                  "features_dim": 16, "probe": "plasticity", "probe_every": 150,
                                  "probe_inputs": 8, "checkpoint_every": 0, "progress": False, **extra})
        assert config["derived"]["trunk"] == "minatar"
        assert train(config, cmd.run_dir(config, tmp_path / "runs"))["status"] == "finished"
    assert report([str(tmp_path / "runs"), "-o", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert "above random + 3 SE" in page and "Sensitivity on MinAtar/Breakout-v1" in page
    assert "(no baseline)" not in page and "MinAtar/Breakout-v1: " in page  # the random run's episodes counted
    assert (tmp_path / "report" / "sensitivity_MinAtar-Breakout-v1.png").exists()
    assert (tmp_path / "report" / "rainbow_MinAtar-Breakout-v1.png").exists()


def test_our_minatar_ids_are_the_packages_own_registration(monkeypatch):
    """agents.rl.envs registers MinAtar's ids without importing the package (it imports seaborn and pandas);
    they must be exactly what ``minatar.gym.register_envs`` registers."""
    import gymnasium as gym
    import minatar.gym

    import agents.rl.envs  # noqa: F401

    calls = []
    monkeypatch.setattr(minatar.gym, "register", lambda id, entry_point, kwargs: calls.append((id, entry_point,
                                                                                             kwargs)))
    minatar.gym.register_envs()
    assert len(calls) == 10
    for env_id, entry_point, kwargs in calls:
        spec = gym.spec(env_id)
        assert (spec.entry_point, spec.kwargs) == (entry_point, kwargs)


@pytest.mark.parametrize("flags, words", [
    (["n_envs=2"], "prioritized replay takes one env"),
    (["v_min=3", "v_max=1"], "v_min must be below v_max"),
    (["n_atoms=1"], "n_atoms must be"),
    (["probe_noise=sampled"], "probe_noise must be"),
])
def test_settings_that_do_not_go_together_are_refused_by_name(flags, words):
    from agents.commands import get_command
    from agents.errors import ConfigError

    with pytest.raises(ConfigError, match=words):
        get_command("rainbow").make_config({"env": "CartPole-v1", "set": flags})
