"""Tests of the one-command showcase (agents.showcase) and of what its figures rest on: the streaming learner's
gradient-covariance samples (distinct, only once enough have been seen) and what a white row of ReLU's
gradient-covariance map is."""

import re

import numpy as np
import pytest
import torch

from agents.lifecycle import execute
from agents import showcase
from agents.stream.commands import COMMANDS, _mse, _sampler, sample_steps
from agents.stream.learner import StreamConfig, build_net, train_stream
from interference.gradcov import gradient_covariance
from runlog import read_run

TINY = {"n": 40, "n_test": 50, "width": 64}


def test_gradcov_samples_are_distinct_and_in_stream_order():
    x = torch.arange(40.0)[:, None]
    sample = _sampler(x, 2 * x, np.random.default_rng(0))
    for _ in range(5):
        bx, by = sample(32)
        values = bx[:, 0].tolist()
        assert len(set(values)) == 32 and values == sorted(values)  # no duplicates, ordered by x
        assert torch.equal(by, 2 * bx)
    assert sorted(sample(40)[0][:, 0].tolist()) == x[:, 0].tolist()  # exactly as many as seen: all of them
    with pytest.raises(ValueError, match="32 distinct samples from the 1 seen"):
        _sampler(x[:1], x[:1], np.random.default_rng(0))(32)


def test_gradcov_waits_for_enough_distinct_samples():
    assert sample_steps([1, 25, 50, 100, 150, 200], 32, 200) == [32, 50, 100, 150, 200]
    assert sample_steps([50, 200], 32, 200) == [50, 200]
    assert sample_steps([1, 10, 20], 32, 20) == []  # a stream shorter than k: no records


def test_stream_run_logs_gradcov_from_the_kth_sample_and_trains_as_without_probes(tmp_path):
    cmd = COMMANDS["stream-sin"]
    base = {"act": "relu", "lr": 3e-3, "seeds": "0", **TINY}
    cfg = cmd.make_config({**base, "probe": "gradcov", "probe_at": "1,20,40"})
    with_probe = execute(cmd.train, cfg, tmp_path / "a")
    run = read_run(tmp_path / "a" / "seed0" / "run.h5")
    assert run.probes["gradcov"]["step"].tolist() == [32, 40]
    assert run.probes["gradcov"]["mse"].shape == (2, 32, 32)
    assert run.scalars["run_end"][1].tolist() == [0]  # "finished"
    without = execute(cmd.train, cmd.make_config({**base, "probe": ""}), tmp_path / "b")
    assert with_probe["final_mse"] == without["final_mse"]


def test_white_rows_are_samples_with_exactly_zero_gradient():
    """A ReLU net of the stream (zero hidden biases at the start) has no active unit at x = 0: f(0) = 0 and the
    loss gradient there is exactly zero, so that sample's row of C is 0 off the diagonal (1 on it). Elephant's
    gradient is never exactly zero there."""
    x = torch.tensor([[0.0], [0.5], [1.0], [1.5]])
    batch = (x, torch.sin(torch.pi * x))
    relu = build_net(StreamConfig(act="relu", width=64), 0)
    with torch.no_grad():
        assert relu(x[:1]).item() == 0.0 and (relu[:-1](x[:1]) == 0).all()
    c = gradient_covariance(relu, _mse, batch)
    assert c[0, 1:].abs().sum() == 0 and c[1:, 0].abs().sum() == 0 and c[0, 0] == 1
    assert (c[1:, 1:] != 0).all()
    assert showcase.zero_gradient_rows([]) == {}
    c = gradient_covariance(build_net(StreamConfig(act="elephant", width=64), 0), _mse, batch)
    assert (c != 0).all()


def test_white_rows_after_training_are_the_smallest_x_where_no_relu_is_active():
    """What the showcase's caption says of its trained ReLU net (seed 0, the showcase's settings): the samples with
    an exactly zero loss gradient are exactly those where no hidden unit is active, f(x) = 0 there, and they are
    the smallest x of the stream."""
    cfg = StreamConfig(act="relu", lr=showcase.METHODS["relu"], seeds=(0,), n_test=50)
    nets = []
    train_stream(cfg, lambda t, ens, xt, yt, mse: nets.append(ens.module(0)) if t == cfg.n else None)
    net = nets[0]
    x = torch.linspace(0.0, 2.0, cfg.n)[:, None]
    batch = (x, torch.sin(torch.pi * x))
    gram = gradient_covariance(net, _mse, batch, normalize=False)
    zero_grad = (gram.diagonal() == 0).numpy()
    with torch.no_grad():
        inactive = (net[0](x) <= 0).all(dim=1).numpy()
        f = net(x)[:, 0].numpy()
    assert net[-1].bias is None  # no output bias: f = 0 where no unit is active
    assert zero_grad[0] and (zero_grad == inactive).all() and (f[zero_grad] == 0).all()
    n = int(zero_grad.sum())
    assert n >= 2 and zero_grad[:n].all() and not zero_grad[n:].any()  # a leading run of the smallest x
    c = gradient_covariance(net, _mse, batch)
    off = c.numpy()[~np.eye(len(c), dtype=bool)].reshape(len(c), -1)
    assert ((off == 0).all(axis=1) == zero_grad).all()  # the white rows of the map


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    out = tmp_path_factory.mktemp("showcase")
    index = showcase.run(out, "0", {**TINY, "probe_at": "1,20,40", "pretrain_steps": 300})
    return out, index.read_text(encoding="utf-8")


def test_showcase_page(page):
    out, text = page
    for src in re.findall(r'<img src="([^"]+)"', text):
        assert (out / src).read_bytes().startswith(b"\x89PNG")
    headings = re.findall(r"<h2>([^<]+)</h2>", text)
    assert "Probes during training: Empirical NTK" in headings
    assert not any(h != h.strip() or "ntk" in h for h in headings)
    assert "curve_test_mse" not in text and not (out / "probes" / "curve_test_mse.png").exists()
    assert text.count("test_mse.png") == 1 and "log scale" in text  # one test-MSE figure, the log-scale one
    assert "without replacement" in text and "once 32 samples have been seen" in text
    assert "1 seed" in text and not re.search(r"\b(n|1) seeds", text)


def test_showcase_captions_explain_white_rows_and_flat_ntk(page):
    out, text = page
    runs = [read_run(p) for p in sorted((out / "runs" / "stream-sin").rglob("run.h5"))]
    zeros = showcase.zero_gradient_rows(runs)
    assert zeros.get("elephant", 0) == 0
    if zeros.get("relu"):
        assert f"White rows and columns ({zeros['relu']} for ReLU in these panels)" in text
        assert "no hidden unit is active" in text
        edge = showcase.zero_output_edge(runs, "relu")
        assert all(0 <= x < 1 for x in edge.values())
        for step, x in edge.items():
            assert f"x &lt;= {x:.2f} after {step} samples" in text
    else:
        assert "White rows" not in text
    # at t = 1 the ReLU net learns x_1 = 0, where its gradient is exactly zero: its NTK is 0 everywhere
    assert showcase.flat_ntk_steps(runs, "relu") == [1] and showcase.flat_ntk_steps(runs, "elephant") == []
    assert "ReLU&#x27;s NTK is 0 everywhere at t = 1" in text or "ReLU's NTK is 0 everywhere at t = 1" in text
    assert "counts in the mean, and not as negative" in text


def test_probe_page_uses_the_showcase_headings_and_captions(page):
    out, _ = page
    text = (out / "probes" / "index.html").read_text(encoding="utf-8")
    headings = re.findall(r"<h3>([^<]+)</h3>", text)
    assert "Empirical NTK" in headings and "NTK" not in headings
    assert "mse loss" not in text and "sparsity.dormant" not in text
    assert "without replacement" in text


def test_showcase_pages_hold_no_development_history(page):
    out, _ = page
    for path in out.rglob("*.html"):
        text = path.read_text(encoding="utf-8").lower()
        assert "session" not in text and "issue" not in text, path
        assert not re.search(r"\b[0-9a-f]{12}\b", text), path  # no commit hashes
        assert "git commit" not in text, path
