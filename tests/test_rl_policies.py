"""SB3 policies with swappable activations: what gets built, initialisation, width matching, save/load."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3 import PPO, SAC
from torch import nn

from agents.rl.config import resolve
from agents.rl.dqn import PaperDQN
from agents.rl.policies import (SPREAD_ATTR, ActActorCriticPolicy, ActDQNPolicy, ActNatureCNN, ActSACPolicy,
                                reapply_spread_bias)
from agents.rl.run import build_model, online_parameters
from interference.activations import FTA, Elephant, Maxout
from interference.nets import match_width, spread_bias_


def _count(module: nn.Module, kind: type[nn.Module]) -> int:
    return sum(isinstance(m, kind) for m in module.modules())


def _model(algo: str, act: str, **values):
    if algo == "ppo":
        values.setdefault("batch_size", 32)
    config = resolve(algo, {"act": act, "seed": 0, "hidden": values.pop("hidden", "64"), "match_width": False,
                            "n_envs": 1, **values})
    return config, build_model(config)


ELEPHANT_PARAMS = {"d": 4, "h": 1, "a": 0.2}


@pytest.mark.parametrize("act, kind", [("elephant", Elephant), ("relu", nn.ReLU), ("maxout", Maxout), ("fta", FTA)])
def test_dqn_q_networks_carry_the_activation(act, kind):
    _, model = _model("dqn", act, env="MountainCar-v0", hidden="60")  # Maxout needs a multiple of k=5
    for net in (model.q_net, model.q_net_target):
        assert _count(net, kind) == 1  # one hidden layer
        assert _count(net, nn.LayerNorm) == (1 if act == "elephant" else 0)
        assert _count(net, nn.ReLU) == (1 if act == "relu" else 0)  # no stray ReLU from SB3's own MLP
    assert isinstance(model.policy, ActDQNPolicy)
    assert model.td_loss == "mse" and model.max_grad_norm is None
    assert isinstance(model.policy.optimizer, torch.optim.RMSprop)
    assert model.policy.optimizer.defaults["alpha"] == 0.999
    # the online and target networks start equal
    for p, q in zip(model.q_net.parameters(), model.q_net_target.parameters()):
        assert torch.equal(p, q)


def test_dqn_elephant_follows_the_paper_initialisation():
    _, model = _model("dqn", "elephant", env="MountainCar-v0", hidden="1000")
    linear, ln, elephant, head = model.q_net.q_net
    assert isinstance(ln, nn.LayerNorm) and isinstance(elephant, Elephant)
    expected = torch.linspace(-np.sqrt(3) * 0.4, np.sqrt(3) * 0.4, 1000)
    torch.testing.assert_close(linear.bias.detach(), expected)
    torch.testing.assert_close(elephant.h.detach(), torch.ones(1000))
    torch.testing.assert_close(elephant.a.detach(), torch.full((1000,), 0.2))
    assert elephant.d == 4 and elephant.learnable
    bound = 1 / np.sqrt(2)  # PyTorch-default weights U[-1/sqrt(fan_in), 1/sqrt(fan_in)]
    assert linear.weight.abs().max() <= bound
    assert torch.count_nonzero(head.bias) == 0
    # Elephant's h and a are trained
    opt_params = {id(p) for g in model.policy.optimizer.param_groups for p in g["params"]}
    assert id(elephant.log_h) in opt_params and id(elephant.log_a) in opt_params


def test_relu_hidden_biases_are_zero():
    _, model = _model("dqn", "relu", env="MountainCar-v0")
    assert torch.count_nonzero(model.q_net.q_net[0].bias) == 0


@pytest.mark.parametrize("act, kind", [("elephant", Elephant), ("relu", nn.ReLU)])
def test_ppo_actor_and_critic_carry_the_activation(act, kind):
    _, model = _model("ppo", act, env="CartPole-v1", hidden="32,32")
    ext = model.policy.mlp_extractor
    assert _count(ext.policy_net, kind) == 2 and _count(ext.value_net, kind) == 2
    assert _count(model.policy, kind) == 4
    assert _count(model.policy, nn.Tanh) == 0  # SB3's default activation is gone
    assert isinstance(model.policy, ActActorCriticPolicy)


def test_ppo_spread_bias_survives_orthogonal_init():
    config, model = _model("ppo", "elephant", env="CartPole-v1", hidden="32", sigma_bias=1.0)
    assert model.policy.ortho_init
    sigma = config["sigma_bias"]
    for net in (model.policy.mlp_extractor.policy_net, model.policy.mlp_extractor.value_net):
        linear = net[0]
        assert getattr(linear, SPREAD_ATTR) == sigma
        torch.testing.assert_close(linear.bias.detach(), torch.linspace(-np.sqrt(3) * sigma, np.sqrt(3) * sigma, 32))
        # the weights are SB3's orthogonal ones (rows orthogonal up to the gain sqrt(2))
        w = linear.weight.detach()
        gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
        torch.testing.assert_close(gram, 2 * torch.eye(gram.shape[0]), atol=1e-4, rtol=1e-4)
    # the action and value heads keep SB3's zero biases
    assert torch.count_nonzero(model.policy.action_net.bias) == 0


def test_reapply_spread_bias_restores_zeroed_biases():
    _, model = _model("ppo", "elephant", env="CartPole-v1", hidden="16")
    linear = model.policy.mlp_extractor.policy_net[0]
    before = linear.bias.detach().clone()
    with torch.no_grad():
        linear.bias.zero_()
    assert reapply_spread_bias(model.policy) == 2  # actor and critic hidden layers
    torch.testing.assert_close(linear.bias.detach(), before)


@pytest.mark.parametrize("act, kind", [("elephant", Elephant), ("relu", nn.ReLU)])
def test_sac_actor_and_both_critics_carry_the_activation(act, kind):
    _, model = _model("sac", act, env="Pendulum-v1", hidden="32,32", learning_starts=10)
    assert isinstance(model.policy, ActSACPolicy)
    assert _count(model.actor.latent_pi, kind) == 2
    for critic in (model.critic, model.critic_target):
        assert len(critic.q_networks) == 2
        for q in critic.q_networks:
            assert _count(q, kind) == 2 and _count(q, nn.LayerNorm) == (2 if act == "elephant" else 0)
    assert _count(model.policy, kind) == 2 + 4 + 4
    if act == "elephant":
        sigma = 2.0  # sac.yml: the paper's SAC Elephant
        torch.testing.assert_close(model.critic.qf1[0].bias.detach(),
                                   torch.linspace(-np.sqrt(3) * sigma, np.sqrt(3) * sigma, 32))
    # SB3's critic optimizer sees the replaced critics
    critic_params = {id(p) for g in model.critic.optimizer.param_groups for p in g["params"]}
    assert {id(p) for p in model.critic.qf1.parameters()} <= critic_params


def test_nature_cnn_keeps_relu_convolutions_and_puts_the_activation_on_512_units():
    obs = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    ext = ActNatureCNN(obs, 512, "elephant", {"d": 4, "h": 1, "a": 0.1}, sigma_bias=2.0)
    assert _count(ext.cnn, nn.ReLU) == 3 and _count(ext.cnn, nn.Conv2d) == 3
    assert _count(ext.linear, Elephant) == 1 and _count(ext.linear, nn.LayerNorm) == 1
    assert ext.linear[0].out_features == 512 and ext.features_dim == 512
    torch.testing.assert_close(ext.linear[0].bias.detach(), spread_bias_(torch.empty(512), 2.0))
    out = ext(torch.randint(0, 256, (2, 4, 84, 84)).float() / 255)
    assert out.shape == (2, 512)
    fta = ActNatureCNN(obs, 64, "fta", {"k": 4, "bound": 2.0})
    assert fta.features_dim == 256


def test_dqn_policy_with_cnn_builds_one_extractor_per_q_network():
    obs = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    spec = {"activation": "elephant", "act_kwargs": {"a": 0.1}, "sigma_bias": 2.0, "layer_norm": None}
    policy = ActDQNPolicy(obs, spaces.Discrete(6), lambda _: 1e-4, net_arch=[], features_extractor_class=ActNatureCNN,
                          features_extractor_kwargs={"features_dim": 512, **spec}, **spec)
    for q in (policy.q_net, policy.q_net_target):
        assert _count(q, Elephant) == 1 and _count(q, nn.ReLU) == 3
        assert q.q_net[0].in_features == 512 and q.q_net[0].out_features == 6
    assert policy.q_net.features_extractor is not policy.q_net_target.features_extractor


def test_width_matching_by_parameter_count():
    base = resolve("dqn", {"env": "MountainCar-v0", "act": "elephant"})
    assert base["derived"]["hidden"] == {"q": [1000]}
    relu = resolve("dqn", {"env": "MountainCar-v0", "act": "relu"})
    assert relu["match_width"] and relu["derived"]["hidden"] == {"q": [match_width("relu", 2, 3)]}
    assert 1600 <= relu["derived"]["hidden"]["q"][0] <= 1750  # the paper's "1700"
    maxout = resolve("dqn", {"env": "MountainCar-v0", "act": "maxout"})
    assert maxout["act_kwargs"] == {"k": 5} and maxout["derived"]["hidden"]["q"][0] % 5 == 0
    fta = resolve("dqn", {"env": "MountainCar-v0", "act": "fta"})
    assert fta["act_kwargs"] == {"k": 20, "bound": 20}
    counts = {}
    for config in (base, relu, maxout, fta):
        counts[config["act"]] = online_parameters(build_model(config), config["algo"])
    ref = counts["elephant"]
    for act, n in counts.items():
        assert abs(n - ref) / ref < 0.02, counts
    off = resolve("dqn", {"env": "MountainCar-v0", "act": "relu", "match_width": False})
    assert off["derived"]["hidden"] == {"q": [1000]}


def _obs_batch(model, n=16):
    rng = np.random.default_rng(0)
    space = model.observation_space
    low = np.where(np.isfinite(space.low), space.low, -1.0)
    high = np.where(np.isfinite(space.high), space.high, 1.0)
    return rng.uniform(low, high, size=(n, *space.shape)).astype(space.dtype)


@pytest.mark.parametrize("algo, cls, env", [("dqn", PaperDQN, "MountainCar-v0"), ("ppo", PPO, "CartPole-v1"),
                                             ("sac", SAC, "Pendulum-v1")])
@pytest.mark.parametrize("act", ["elephant", "relu"])
def test_save_load_round_trip(tmp_path, algo, cls, env, act):
    extra = {"learning_starts": 20} if algo != "ppo" else {"n_steps": 32, "batch_size": 32, "n_epochs": 1}
    _, model = _model(algo, act, env=env, hidden="32", **extra)
    model.learn(64)  # a few updates, so that Elephant's h and a moved from their initial values
    if act == "elephant" and algo == "dqn":
        assert not torch.allclose(model.q_net.q_net[2].a, torch.full((32,), 0.2))
    path = tmp_path / "model.zip"
    model.save(path)
    loaded = cls.load(path, device="cpu")
    assert type(loaded.policy) is type(model.policy)
    assert loaded.policy.act_spec == model.policy.act_spec
    a, b = model.policy.state_dict(), loaded.policy.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    obs = _obs_batch(model)
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0])
    if algo == "dqn":
        assert loaded.td_loss == "mse" and loaded.exploration_steps == model.exploration_steps
        with torch.no_grad():
            x = torch.as_tensor(obs)
            torch.testing.assert_close(model.q_net(x), loaded.q_net(x), rtol=0, atol=0)


def test_paper_dqn_epsilon_schedule_is_in_absolute_steps():
    _, model = _model("dqn", "relu", env="MountainCar-v0")
    assert model.learning_starts == 1000 and model.exploration_steps == 1000
    assert model.epsilon(0) == 1.0 and model.epsilon(1000) == 1.0
    assert model.epsilon(1500) == pytest.approx(0.505)
    assert model.epsilon(2000) == pytest.approx(0.01) and model.epsilon(10**6) == pytest.approx(0.01)
    assert model.target_update_interval == 100 and model.train_freq.frequency == 1 and model.batch_size == 32




def test_sac_probe_actor_loss_is_sb3_loss_with_the_batch_noise():
    """The probe's SAC actor loss (noise drawn with the batch, so it is a function of the sample) against SB3's
    own squashed-Gaussian log-probability on the same noise, and gradcov runs on it."""
    import interference
    from probes.sb3 import probe_context

    _, model = _model("sac", "elephant", env="Pendulum-v1", hidden="32,32", learning_starts=10)
    model.learn(40)
    ctx = probe_context(model, np.random.default_rng(0), None, step=40)
    batch = ctx.sample(8)
    obs, noise = batch[0], batch[3]
    actor = model.policy.actor
    mean, log_std, _ = actor.get_action_dist_params(obs)
    gaussian = mean + log_std.exp() * noise
    dist = actor.action_dist.proba_distribution(mean, log_std)
    log_prob = dist.log_prob(torch.tanh(gaussian), gaussian)
    q = torch.cat(model.policy.critic(obs, torch.tanh(gaussian)), dim=1).min(dim=1).values
    alpha = torch.exp(model.log_ent_coef.detach())
    expected = alpha * log_prob - q
    torch.testing.assert_close(ctx.losses["actor"](model.policy, batch), expected, rtol=1e-5, atol=1e-5)
    c = interference.gradient_covariance(model.policy, ctx.losses["actor"], batch, params=ctx.loss_params["actor"])
    assert c.shape == (8, 8) and torch.isfinite(c).all()
