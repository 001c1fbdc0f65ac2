import numpy as np
import pytest
import torch
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.env_util import make_vec_env

from interference import mlp
from probes import NTKProbe, ProbeContext, ProbeRunner, make_probe
from runlog import read_run
from probes.runner import frozen_noise
from probes.sb3 import ProbeCallback


def all_probes(every):
    return [make_probe("gradcov", k=8, every=every), make_probe("ntk", every=every),
            make_probe("sparsity", every=every), make_probe("weights", every=every),
            make_probe("outputs", every=every)]


def make_algo(algo):
    if algo is DQN:
        return DQN("MlpPolicy", "CartPole-v1", seed=3, learning_starts=50, buffer_size=400, train_freq=1,
                   target_update_interval=50, policy_kwargs={"net_arch": [32]})
    return PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=3), seed=3, n_steps=32, batch_size=32,
               n_epochs=2, policy_kwargs={"net_arch": [32]})


@pytest.mark.parametrize("algo", [DQN, PPO])
def test_sb3_probes_leave_training_bit_identical(algo, tmp_path):
    plain = make_algo(algo)
    plain.learn(300)
    probed = make_algo(algo)
    probed.learn(300, callback=ProbeCallback(all_probes(64), tmp_path / "run.h5", config={"algo": algo.__name__},
                                             seed=3, n_inputs=8))
    for (name, a), (_, b) in zip(plain.policy.state_dict().items(), probed.policy.state_dict().items()):
        assert torch.equal(a, b), name
    run = read_run(tmp_path / "run.h5")
    losses = ["td"] if algo is DQN else ["actor", "critic"]
    records = len(run.probes["gradcov"]["step"])
    assert records >= 3
    for loss in losses:
        c = run.probes["gradcov"][loss]
        assert c.shape == (records, 8, 8)
        assert np.allclose(c, c.transpose(0, 2, 1), atol=1e-6) and np.allclose(c[:, range(8), range(8)], 1)
    assert run.probes["ntk"]["kernel"].shape == (records, 8, 8)
    assert run.probes["sparsity"]["dormant"].shape[0] == records
    assert run.probes["inputs"]["x"].shape == (1, 8, 4)
    assert len(run.scalars["episode_return"][0]) > 0
    assert run.config == {"algo": algo.__name__} and run.seed == 3


def test_probe_cadence_with_coarse_steps():
    p = NTKProbe(every=100, at=(250,))
    fired = [s for s in (0, 64, 128, 192, 256, 320, 384) if p.due(s) and (p._advance(s) or True)]
    assert fired == [128, 256, 320]  # first step at/after 100, 200 (and 250), 300; none missed, none doubled


def test_frozen_noise_restores_rng_and_dropout():
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.5)).train()
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    with frozen_noise(net):
        assert not net[1].training
        torch.rand(100)
    assert net[1].training and torch.equal(torch.rand(3), expected)


def test_runner_probes_a_plain_loop(tmp_path):
    torch.manual_seed(0)
    net = mlp(2, [16], 1, "elephant")
    inputs = torch.randn(10, 2)
    data = (torch.randn(50, 2), torch.randn(50, 1))
    rng = np.random.default_rng(0)

    def sample(k):
        i = torch.as_tensor(rng.integers(0, 50, size=k))
        return data[0][i], data[1][i]

    ctx = ProbeContext(step=0, model=net, losses={"mse": lambda m, b: (m(b[0]) - b[1]).pow(2).flatten()},
                       sample=sample, inputs=inputs)
    with ProbeRunner(all_probes(5), tmp_path / "loop.h5", example=ctx, config={"algo": "loop"}, seed=0,
                     scalars=["loss"]) as runner:
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for step in range(1, 21):
            opt.zero_grad()
            loss = (net(data[0]) - data[1]).pow(2).mean()
            loss.backward()
            opt.step()
            runner.scalar("loss", step, loss.item())
            ctx.step = step
            runner.on_step(ctx)
    run = read_run(tmp_path / "loop.h5")
    assert run.probes["weights"]["step"].tolist() == [5, 10, 15, 20]
    assert run.probes["weights"]["elephant_h"].shape == (4, 1, 3)
    assert run.probes["sparsity"]["activation_sparsity"].shape == (4, 1)
    assert run.attrs["probe_settings"]["sparsity"]["layers"] == ["2"]
    assert len(run.scalars["loss"][0]) == 20


def test_probe_errors():
    with pytest.raises(ValueError, match="unknown probe 'fisher'"):
        make_probe("fisher")
    with pytest.raises(ValueError, match="k must be an int >= 2"):
        make_probe("gradcov", k=1)
    with pytest.raises(ValueError, match="every must be a positive int"):
        make_probe("ntk", every=0)
    ctx = ProbeContext(step=0, model=mlp(2, [4], 1))
    with pytest.raises(ValueError, match="needs fixed probe inputs"):
        make_probe("ntk").fields(ctx)
    with pytest.raises(ValueError, match="needs training losses"):
        make_probe("gradcov").fields(ctx)


def _train_with_reference(model, steps, callback):
    """``model.learn`` under ``callback``; returns (num_timesteps, SB3 logger values) right after each ``train()``."""
    updates = []
    train = model.train

    def recorded_train(*args, **kwargs):
        train(*args, **kwargs)
        updates.append((model.num_timesteps, dict(model.logger.name_to_value)))

    model.train = recorded_train
    model.learn(steps, callback=callback)
    return updates


@pytest.mark.parametrize("loss_every", [1, None])
def test_ppo_training_scalars_are_stamped_with_their_update(loss_every, tmp_path):
    # SB3 calls train() after on_rollout_end: a record read there would carry the previous update's values
    total = 256
    model = PPO("MlpPolicy", "CartPole-v1", seed=0, n_steps=64, batch_size=64, n_epochs=1,
                learning_rate=lambda progress: 1e-3 * progress, policy_kwargs={"net_arch": [16]})
    callback = ProbeCallback([make_probe("weights", every=64)], tmp_path / "run.h5", config={}, seed=0,
                             loss_every=loss_every)
    updates = _train_with_reference(model, total, callback)
    run = read_run(tmp_path / "run.h5")
    steps, lr = run.scalars["learning_rate"]
    assert steps.tolist() == [64, 128, 192, 256]  # one record per update, the last one included
    assert np.allclose(lr, [1e-3 * (1 - s / total) for s in steps], rtol=0, atol=1e-12)
    loss_steps, loss = run.scalars["loss"]
    assert loss_steps.tolist() == [s for s, _ in updates] == steps.tolist()
    assert np.allclose(loss, [values["train/loss"] for _, values in updates], rtol=1e-6)


def test_dqn_training_scalars_are_stamped_with_their_update(tmp_path):
    model = DQN("MlpPolicy", "CartPole-v1", seed=0, learning_starts=50, buffer_size=400, train_freq=4,
                gradient_steps=2, target_update_interval=50, policy_kwargs={"net_arch": [16]})
    callback = ProbeCallback([make_probe("weights", every=64)], tmp_path / "run.h5", config={}, seed=0,
                             loss_every=100)
    updates = dict(_train_with_reference(model, 310, callback))
    assert min(updates) == 52 and max(updates) == model.num_timesteps == 312  # train() after each 4-step rollout
    run = read_run(tmp_path / "run.h5")
    steps, loss = run.scalars["loss"]
    assert steps.tolist() == [52, 100, 200, 300, 312]  # first update at/after each multiple of 100, and the last
    assert np.allclose(loss, [updates[s]["train/loss"] for s in steps.tolist()], rtol=1e-6)
    assert run.scalars["learning_rate"][0].tolist() == steps.tolist()


def test_probe_schemas_match_fields_by_name_then_pattern_and_round_trip():
    from probes import PROBES
    from runlog import FieldDoc, ProbeSchema

    gradcov = PROBES["gradcov"].schema
    assert gradcov.doc("td_offdiag_mean").plot == "curve" and gradcov.doc("actor").plot == "heatmap"
    assert ProbeSchema.from_json(gradcov.to_json()) == gradcov
    sparsity = PROBES["sparsity"].schema
    assert sorted(["saturated", "dormant", "activation_sparsity"], key=sparsity.rank) == \
        ["activation_sparsity", "dormant", "saturated"]
    assert all(p.schema is not None for p in PROBES.values())  # every built-in probe says what its fields mean
    with pytest.raises(ValueError, match="plot must be one of"):
        FieldDoc("x", plot="pie")
    with pytest.raises(ValueError, match="not a probe schema"):
        ProbeSchema.from_json({"fields": {}})


def test_weights_probe_records_the_models_layers_for_reports():
    from probes.builtin import module_kinds

    net = mlp(2, [16], 1, "elephant")  # Linear, LayerNorm, Elephant, Linear
    probe = make_probe("weights", every=1)
    probe.fields(ProbeContext(step=0, model=net))
    assert probe.settings()["modules"] == module_kinds(net) == [
        ["0", "linear", "Linear"], ["1", "norm", "LayerNorm"], ["2", "activation", "Elephant"], ["3", "linear", "Linear"]]
    cnn = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8, 2))
    assert [kind for _, kind, _ in module_kinds(cnn)] == ["conv", "activation", "other", "linear"]
