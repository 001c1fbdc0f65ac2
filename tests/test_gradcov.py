import pytest
import torch

from interference import gradient_covariance, mlp, per_sample_grads
from reference_models import build, flat_grad, inputs, trainable


def td_loss(model, batch):
    obs, actions, targets = batch
    q = model(obs).gather(1, actions[:, None]).squeeze(1)
    return (q - targets) ** 2


def make_batch(k=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(k, 4, generator=g, dtype=torch.float64)
    actions = torch.randint(0, 3, (k,), generator=g)
    targets = torch.randn(k, generator=g, dtype=torch.float64)
    return obs, actions, targets


def explicit(model, batch):
    params = trainable(model)
    grads = torch.stack([flat_grad(td_loss(model, tuple(t[i:i + 1] for t in batch))[0], params)
                         for i in range(batch[0].shape[0])])
    gram = grads @ grads.T
    n = grads.norm(dim=1)
    return gram, gram / n[:, None] / n[None, :], grads


@pytest.mark.parametrize("name", ["mlp-relu", "mlp-elephant-ln", "unknown-module", "buffers"])
@pytest.mark.parametrize("implementation", ["auto", "func"])
def test_matches_explicit_loop(name, implementation):
    model = build(name)
    obs = inputs(name, 9)
    batch = (obs, torch.arange(9) % 2, torch.linspace(-1, 1, 9, dtype=torch.float64))
    gram, cov, _ = explicit(model, batch)
    got = gradient_covariance(model, td_loss, batch, implementation=implementation)
    assert torch.allclose(got, cov, atol=1e-10)
    assert torch.allclose(got, got.T) and torch.allclose(got.diagonal(), torch.ones(9, dtype=torch.float64))
    raw = gradient_covariance(model, td_loss, batch, normalize=False, implementation=implementation)
    assert torch.allclose(raw, gram, rtol=1e-10)


def test_per_sample_grads_match_loop():
    model = build("mlp-elephant-ln")
    batch = make_batch()
    _, _, grads = explicit(model, batch)
    psg = per_sample_grads(model, td_loss, batch)
    assert torch.allclose(torch.cat([g.reshape(9, -1) for g in psg.values()], 1), grads, atol=1e-12)


def test_zero_gradient_sample_has_no_nan():
    model = build("mlp-tanh")
    obs, actions, targets = make_batch()
    with torch.no_grad():
        targets[2] = model(obs)[2, actions[2]]  # TD error exactly 0 -> zero gradient
    cov = gradient_covariance(model, td_loss, (obs, actions, targets))
    assert torch.isfinite(cov).all()
    assert cov[2].tolist() == [0.0] * 2 + [1.0] + [0.0] * 6
    assert torch.allclose(cov, cov.T) and (cov.diagonal() == 1).all()


def test_loss_must_be_per_sample():
    model = mlp(4, [8], 3).double()
    with pytest.raises(ValueError, match="one loss per sample"):
        gradient_covariance(model, lambda m, b: td_loss(m, b).mean(), make_batch())
    with pytest.raises(ValueError, match="batch size"):
        obs, actions, targets = make_batch()
        gradient_covariance(model, td_loss, (obs, actions[:4], targets))


def test_errors_name_the_callers_batch_and_training_modes():
    model = mlp(4, [8], 3).double()
    batch = make_batch(k=8)
    with pytest.raises(ValueError, match=r"shape \(8,\) for a batch of 8"):
        gradient_covariance(model, lambda m, b: td_loss(m, b)[:3], batch)
    bn = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).double().train()
    for fn in (per_sample_grads, gradient_covariance):
        with pytest.raises(ValueError, match="BatchNorm1d.*model.eval"):
            fn(bn, td_loss, batch)
    with pytest.raises(ValueError, match="implementation"):
        per_sample_grads(model, td_loss, batch, implementation="fast")


def test_per_sample_grads_loop_matches_vmap():
    model = build("mlp-elephant-ln")
    batch = make_batch()
    a = per_sample_grads(model, td_loss, batch, implementation="func")
    b = per_sample_grads(model, td_loss, batch, implementation="loop")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-10, atol=1e-12) for k in a)


def test_float32_td_loss_near_its_target_takes_the_rules_without_warnings():
    """A squared TD error of Q values near their targets (cancellation) rounds differently in a batch of 32 than
    alone; that is not sample mixing (a DQN probe fell back to the exact path on it)."""
    import warnings

    import interference as itf

    torch.manual_seed(0)
    net = mlp(2, [1000], 3, "elephant")
    with torch.no_grad():
        net[-1].bias.fill_(-20.0)
    g = torch.Generator().manual_seed(0)
    obs, actions = torch.randn(32, 2, generator=g), torch.randint(0, 3, (32,), generator=g)
    with torch.no_grad():
        targets = net(obs).gather(1, actions[:, None]).squeeze(1) + 1e-2 * torch.randn(32, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cov = gradient_covariance(net, td_loss, (obs, actions, targets))
    assert torch.isfinite(cov).all()
    assert {p.path for p in itf.explain(net, (obs, actions, targets), loss_fn=td_loss).paths.values()} == {"rule"}
