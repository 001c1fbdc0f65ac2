"""Tests of reports (run logs -> figures and index.html), on small synthetic run logs."""

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from runlog import Field, RunLog, read_run
from probes import SparsityProbe
from reports import data, plots
from reports.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [{"algo": "dqn", "env": "MountainCar-v0", "act": "elephant", "lr": 0.001},
           {"algo": "dqn", "env": "MountainCar-v0", "act": "relu", "lr": 0.0001}]
SEEDS = (0, 1)
K, N, OBS, LAYERS, PARAMS = 6, 5, 3, ["net.1", "net.3"], ["net.0.weight", "net.0.bias"]
PROBE_STEPS = [0, 250, 500, 750, 1000]
EPISODE_STEPS = np.arange(50, 1001, 50)  # 20 episodes
PNG = b"\x89PNG\r\n\x1a\n"
SPARSITY_FIELDS = tuple(SparsityProbe.schema.fields)  # the probe's declared fields


def episode_returns(config_index, seed):
    """The returns written for a run, (20,)."""
    return np.random.default_rng([config_index, seed]).normal(10.0 * config_index, 3.0, len(EPISODE_STEPS))


def write_run(path, config_index, seed):
    rng = np.random.default_rng([config_index, seed, 1])
    probes = {
        "gradcov": {"td": Field((K, K)), "td_offdiag_mean": Field(()), "td_negative_fraction": Field(())},
        "ntk": {"kernel": Field((N, N))},
        "sparsity": {f: Field((len(LAYERS),)) for f in SPARSITY_FIELDS},
        "weights": {"param_norm": Field((len(PARAMS),)), "grad_norm": Field((len(PARAMS),)),
                    "elephant_h": Field((len(LAYERS), 3)), "elephant_a": Field((len(LAYERS), 3))},
        "inputs": {"x": Field((N, OBS))},
    }
    settings = {"sparsity": {"every": 250, "layers": LAYERS},
                "weights": {"every": 250, "parameters": PARAMS, "elephant_layers": LAYERS}}
    with RunLog(path, config=CONFIGS[config_index], seed=seed, probes=probes, scalars=["episode_return", "loss"],
                probe_settings=settings) as log:
        log.append("inputs", 0, x=rng.normal(size=(N, OBS)))
        for step in PROBE_STEPS:
            c = np.clip(rng.uniform(-1.5, 1.5, (K, K)), -1, 1)
            c = (c + c.T) / 2
            np.fill_diagonal(c, 1.0)
            off = c[~np.eye(K, dtype=bool)]
            log.append("gradcov", step, td=c, td_offdiag_mean=off.mean(), td_negative_fraction=(off < 0).mean())
            j = rng.normal(size=(N, 4))
            log.append("ntk", step, kernel=j @ j.T)
            log.append("sparsity", step, **{f: rng.uniform(0, 1, len(LAYERS)) for f in SPARSITY_FIELDS})
            h = np.sort(rng.uniform(0.5, 2.0, (len(LAYERS), 3)), axis=1)[:, [1, 0, 2]]  # (mean, min, max)
            log.append("weights", step, param_norm=rng.uniform(1, 2, len(PARAMS)),
                       grad_norm=rng.uniform(0, 1, len(PARAMS)), elephant_h=h, elephant_a=h + 1)
            log.scalar("loss", step, float(rng.uniform()))
        for step, value in zip(EPISODE_STEPS, episode_returns(config_index, seed)):
            log.scalar("episode_return", int(step), float(value))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """2 configs x 2 seeds of run logs, in nested folders."""
    root = tmp_path_factory.mktemp("runs")
    for i in range(len(CONFIGS)):
        for seed in SEEDS:
            write_run(root / f"cfg{i}" / f"seed{seed}.h5", i, seed)
    return root


@pytest.fixture(scope="module")
def groups(run_dir):
    return data.group_by_config(read_run(p) for p in sorted(run_dir.rglob("*.h5")))


def image_sources(index):
    return re.findall(r'<img src="([^"]+)"', index.read_text())


def assert_report(index):
    assert index.is_file()
    sources = image_sources(index)
    assert {"curve_episode_return.png", "curve_loss.png", "gradcov_td.png", "gradcov_td_over_time.png",
            "ntk.png", "probe_sparsity_per_layer0_0.png", "probe_sparsity_per_layer0_1.png",  # from schemas:
            "probe_weights_layer_range0_0.png", "probe_weights_layer_range0_1.png",  # Elephant's h and a,
            "probe_weights_per_layer0_0.png"} <= set(sources)  # parameter and gradient norms
    for src in sources:
        path = index.parent / src
        assert path.is_file(), src
        assert path.read_bytes()[:8] == PNG, src
    text = index.read_text()
    for run in ("cfg0/seed0.h5", "cfg1/seed1.h5"):
        assert run in text
    assert "act=elephant lr=0.001" in text and "MountainCar-v0" in text
    assert "Sparsity and dormancy" in text and "fraction of dormant units" in text and "elephant_h" in text


def test_cli_in_process(run_dir, tmp_path, capsys):
    out = tmp_path / "report"
    assert main([str(run_dir / "cfg0"), str(run_dir / "cfg1" / "seed0.h5"), str(run_dir / "cfg1" / "seed1.h5"),
                 "-o", str(out)]) == 0
    index = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert index == out / "index.html"
    assert_report(index)


def test_cli_subprocess(run_dir, tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "reports", str(run_dir), "-o", str(out), "--steps", "260,1000"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(out / "index.html")
    assert_report(out / "index.html")


def test_group_labels(groups):
    assert list(groups) == ["act=elephant lr=0.001", "act=relu lr=0.0001"]
    assert [[r.seed for r in runs] for runs in groups.values()] == [[0, 1], [0, 1]]


def test_learning_curve_mean_and_standard_error(groups):
    runs = groups["act=relu lr=0.0001"]
    r0, r1 = episode_returns(1, 0), episode_returns(1, 1)
    curve = data.learning_curve(runs, num=len(EPISODE_STEPS))  # grid == the episode steps
    np.testing.assert_allclose(curve.steps, EPISODE_STEPS)
    np.testing.assert_allclose(curve.mean, (r0 + r1) / 2)
    np.testing.assert_allclose(curve.sem, np.abs(r0 - r1) / 2)  # std(ddof=1) / sqrt(2) of two values
    fine = data.learning_curve(runs, num=2 * len(EPISODE_STEPS) - 1)  # grid points halfway between episodes
    m0, m1 = (r0[:-1] + r0[1:]) / 2, (r1[:-1] + r1[1:]) / 2
    np.testing.assert_allclose(fine.mean[1::2], (m0 + m1) / 2)
    np.testing.assert_allclose(fine.sem[1::2], np.abs(m0 - m1) / 2)
    smooth = data.learning_curve(runs, num=len(EPISODE_STEPS), window=2)
    np.testing.assert_allclose(smooth.values[0, 1:], (r0[:-1] + r0[1:]) / 2)
    assert smooth.values[0, 0] == pytest.approx(r0[0])


def test_learning_curve_runs_of_different_length(groups):
    long, short = groups["act=elephant lr=0.001"]
    steps, values = short.scalars["episode_return"]
    short = dataclasses.replace(short, scalars={"episode_return": (steps[:10], values[:10])})
    curve = data.learning_curve([long, short], num=len(EPISODE_STEPS))
    np.testing.assert_array_equal(curve.n, [2] * 10 + [1] * 10)
    assert np.isnan(curve.sem[10:]).all() and np.isfinite(curve.sem[:10]).all()
    np.testing.assert_allclose(curve.mean[10:], episode_returns(0, 0)[10:])
    assert data.learning_curve([long], scalar="test_mse") is None


def test_final_return(groups):
    run = groups["act=relu lr=0.0001"][1]
    returns = episode_returns(1, 1)
    assert data.final_return(run) == pytest.approx(returns[-2:].mean())  # 10% of 20 episodes
    assert data.final_return(run, fraction=0.25) == pytest.approx(returns[-5:].mean())
    assert data.final_return(run, fraction=0.01) == pytest.approx(returns[-1])
    with pytest.raises(ValueError, match="test_mse"):
        data.final_return(run, scalar="test_mse")


def test_record_selection(groups):
    run = groups["act=elephant lr=0.001"][0]
    assert data.training_length(run) == 1000
    assert [r.step for r in data.select_records(run, "gradcov", "td")] == [500, 1000]
    records = data.select_records(run, "gradcov", "td", [260, 10_000])
    assert [(r.step, r.target) for r in records] == [(250, 260), (1000, 10_000)]
    np.testing.assert_array_equal(records[0].value, run.probes["gradcov"]["td"][1])
    assert data.gradcov_losses(run) == ["td"]
    assert data.ntk_kind(run) == "matrix"
    assert data.select_records(run, "gradcov", "critic") == []


def test_probe_series_and_layer_names(groups):
    runs = groups["act=elephant lr=0.001"]
    s = data.probe_series(runs, "weights", "elephant_h")
    np.testing.assert_array_equal(s.steps, PROBE_STEPS)
    assert s.values.shape == (2, len(PROBE_STEPS), len(LAYERS), 3)
    np.testing.assert_allclose(s.mean, np.mean([r.probes["weights"]["elephant_h"] for r in runs], axis=0),
                               rtol=1e-6)
    assert data.layer_names(runs[0], "sparsity", "layers", 2) == LAYERS
    assert data.layer_names(runs[0], "sparsity", "layers", 3) == ["layer 0", "layer 1", "layer 2"]
    assert data.probe_series(runs, "sparsity", "missing") is None


def test_heatmap_color_limits_are_fixed(groups):
    panels = {label: data.select_records(runs[0], "gradcov", "td") for label, runs in groups.items()}
    fig = plots.gradcov_heatmaps(panels, "td")
    images = [im for ax in fig.axes for im in ax.get_images()]
    assert len(images) == 4  # 2 groups x (midpoint, end)
    for im in images:
        assert im.get_clim() == (-1.0, 1.0)
        assert im.get_cmap().name == "RdBu_r"
    assert len(fig.axes) == 5  # 4 panels and one shared colorbar


def test_streaming_run_with_ntk_against_current(tmp_path, capsys):
    path = tmp_path / "stream.h5"
    x = np.linspace(-1, 1, N, dtype=np.float32)[:, None]
    probes = {"ntk": {"kernel": Field((N,)), "x_t": Field((1,))}, "inputs": {"x": Field((N, 1))}}
    with RunLog(path, config={"algo": "stream-sin", "act": "elephant", "lr": 0.01}, seed=3, probes=probes,
                scalars=["test_mse"]) as log:
        log.append("inputs", 0, x=x)
        for step in (100, 200):
            log.append("ntk", step, kernel=np.exp(-(x[:, 0] - 0.5) ** 2), x_t=[0.5])
            log.scalar("test_mse", step, 1.0 / step)
    (record,) = data.current_ntk(read_run(path), [150])
    assert record.step == 100 and record.x_t.tolist() == [0.5] and record.inputs.shape == (N, 1)
    assert main([str(path), "-o", str(tmp_path / "out")]) == 0
    index = Path(capsys.readouterr().out.strip())
    assert set(image_sources(index)) == {"curve_test_mse.png", "ntk_current.png"}


def test_groups_of_configs_that_print_alike_stay_apart(groups):
    run = groups["act=relu lr=0.0001"][0]
    runs = [dataclasses.replace(run, config={"n": n}) for n in ("1", 1, 2)]
    assert list(data.group_by_config(runs)) == ["n=1", "n=1 #2", "n=2"]


def test_run_log_without_records_gives_tables_only(tmp_path, capsys):
    path = tmp_path / "empty.h5"
    probes = {"gradcov": {"td": Field((K, K))}, "ntk": {"kernel": Field((N, N))}, "inputs": {"x": Field((N, 1))}}
    RunLog(path, config={"algo": "dqn"}, seed=0, probes=probes, scalars=["episode_return"]).close()
    assert main([str(path), "-o", str(tmp_path / "out")]) == 0
    index = Path(capsys.readouterr().out.strip())
    assert image_sources(index) == [] and "empty.h5" in index.read_text()


def write_foreign_hdf5(path):
    with h5py.File(path, "w") as f:
        f["data"] = np.arange(3)


def write_random_bytes(path):
    path.write_bytes(np.random.default_rng(0).bytes(4096))


@pytest.mark.parametrize("write", [write_foreign_hdf5, write_random_bytes])
def test_not_a_run_log_exits_2(run_dir, tmp_path, capsys, write):
    bad = tmp_path / "bad.h5"
    write(bad)
    assert main([str(run_dir / "cfg0"), str(bad), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "index.html").exists()


def test_missing_path_exits_2(tmp_path, capsys):
    missing = tmp_path / "missing.h5"
    assert main([str(missing), "-o", str(tmp_path / "out")]) == 2
    assert str(missing) in capsys.readouterr().err


def test_not_a_run_log_subprocess(tmp_path):
    bad = tmp_path / "random.h5"
    write_random_bytes(bad)
    proc = subprocess.run([sys.executable, "-m", "reports", str(bad), "-o", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert str(bad) in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def write_truncated_run_log(path):
    """A valid run log cut to half its bytes; returns its full size."""
    write_run(path, 0, 0)
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[: size // 2])
    return size


def test_truncated_run_log_named_explicitly_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.h5"
    write_truncated_run_log(bad)
    assert main([str(bad), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: corrupt or truncated HDF5 file") and err.count("\n") == 1


def test_folder_mode_skips_unreadable_run_logs(tmp_path, capsys):
    folder = tmp_path / "runs"
    for i, seed in [(0, 0), (0, 1), (1, 0)]:
        write_run(folder / f"cfg{i}" / f"seed{seed}.h5", i, seed)
    size = write_truncated_run_log(folder / "cfg1" / "seed1.h5")
    write_random_bytes(folder / "junk.h5")
    out = tmp_path / "report"
    assert main([str(folder), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out / "index.html")
    assert captured.err.splitlines() == [
        f"warning: skipping {folder / 'cfg1' / 'seed1.h5'}: corrupt or truncated HDF5 file: it has {size // 2} "
        f"bytes, its superblock says {size}",
        f"warning: skipping {folder / 'junk.h5'}: not an HDF5 file (no HDF5 signature)"]
    text = (out / "index.html").read_text()
    assert "cfg0/seed1.h5" in text and "cfg1/seed0.h5" in text and "cfg1/seed1.h5" not in text
    assert (out / "curve_episode_return.png").read_bytes()[:8] == PNG


def test_folder_without_readable_run_logs_exits_2(tmp_path, capsys):
    write_truncated_run_log(tmp_path / "a.h5")
    write_random_bytes(tmp_path / "b.h5")
    assert main([str(tmp_path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: none of the 2 run logs is readable; the first: {tmp_path / 'a.h5'}: corrupt")
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["file", "under_file", "sysfs"])
def test_unwritable_output_exits_2(run_dir, tmp_path, capsys, where):
    (tmp_path / "file").write_text("not a folder")
    out = {"file": tmp_path / "file", "under_file": tmp_path / "file" / "out", "sysfs": Path("/sys/x")}[where]
    if where == "sysfs" and not Path("/sys/kernel").is_dir():
        pytest.skip("no sysfs at /sys")
    assert main([str(run_dir / "cfg0"), "-o", str(out)]) == 2
    reason = {"file": "output path exists and is not a directory", "under_file": "cannot write the report there: "
              "Not a directory", "sysfs": "cannot write the report there: Operation not permitted"}[where]
    assert capsys.readouterr().err == f"error: {out}: {reason}\n"


def test_unwritable_output_subprocess(run_dir, tmp_path):
    out = tmp_path / "file"
    out.write_text("not a folder")
    proc = subprocess.run([sys.executable, "-m", "reports", str(run_dir), "-o", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"error: {out}: output path exists and is not a directory\n"


def test_labels_name_only_differing_settings(groups):
    run = groups["act=relu lr=0.0001"][0]
    elephant = {"algo": "dqn", "act": "elephant", "act_kwargs": {"d": 4, "h": 1, "a": 0.2}, "n_timesteps": 2000,
                "derived": {"hidden": {"q": [1000]}, "cnn": False}}
    configs = [elephant,
               {**elephant, "act_kwargs": {"d": 8, "h": 1, "a": 0.2}},
               {**elephant, "act": "relu", "act_kwargs": {}, "derived": {"hidden": {"q": [1667]}, "cnn": False}},
               {**elephant, "n_timesteps": 50_000, "derived": {"hidden": {"q": [1000]}, "cnn": True}}]
    runs = [dataclasses.replace(run, config=c) for c in configs]
    assert list(data.group_by_config(runs)) == ["act=elephant act_kwargs.d=4 n_timesteps=2000",
                                                "act=elephant act_kwargs.d=8 n_timesteps=2000",
                                                "act=relu n_timesteps=2000",
                                                "act=elephant act_kwargs.d=4 n_timesteps=50000"]
    # Elephant's defaults against ReLU's follow from act; a LayerNorm ablation within one activation does not
    plain = [{"act": "elephant", "layer_norm": True, "sigma_bias": 0.4, "act_kwargs": {"d": 4}},
             {"act": "relu", "layer_norm": False, "sigma_bias": None, "act_kwargs": {}}]
    assert data.config_labels(plain) == ["act=elephant", "act=relu"]
    ablation = [*plain, {"act": "relu", "layer_norm": True, "sigma_bias": None, "act_kwargs": {}}]
    assert data.config_labels(ablation) == ["act=elephant layer_norm=true", "act=relu layer_norm=false",
                                            "act=relu layer_norm=true"]
    # torch_threads says how a run was executed (single runs' logs record it, population members' do not): one setting
    executed = [dataclasses.replace(run, config=c) for c in (elephant | {"torch_threads": 1, "device": "cuda"},
                                                             elephant, configs[2] | {"torch_threads": 4})]
    assert {k: len(v) for k, v in data.group_by_config(executed).items()} == {"act=elephant": 2, "act=relu": 1}
    assert data.config_key(executed[0].config) == data.config_key(executed[1].config)
    only_derived = [dataclasses.replace(run, config=c) for c in (elephant, configs[3] | {"n_timesteps": 2000})]
    assert list(data.group_by_config(only_derived)) == ["algo=dqn act=elephant", "algo=dqn act=elephant #2"]


def test_atari_human_normalised_scores_are_the_last_evaluations_against_random_and_human():
    """(R - random) / (human - random) of each run's last evaluation (mean over its episodes), aggregated per
    algorithm and activation over games x seeds by rliable; a game without reference scores is left out, named."""
    from types import SimpleNamespace

    from reports.atari import SCORES, human_normalised

    def run(seed, last):
        return SimpleNamespace(seed=seed, scalars={"eval_return": (np.array([10, 20, 20]), np.array([0.0, last, last]))})

    amidar, pong = SCORES["Amidar"], SCORES["Pong"]
    groups = [SimpleNamespace(algo="dqn", act="elephant", env="ALE/Amidar-v5",
                              runs=[run(1, amidar["human"]), run(0, amidar["random"])]),
              SimpleNamespace(algo="dqn", act="elephant", env="ALE/Pong-v5", runs=[run(0, pong["human"]), run(1, 0.0)]),
              SimpleNamespace(algo="dqn", act="elephant", env="ALE/Tetris-v5", runs=[run(0, 1.0)])]
    rows, notes = human_normalised(groups)
    assert len(rows) == 1 and rows[0][:4] == ["DQN", "elephant", "2", "2"]
    scores = [0.0, 1.0, 1.0, (0.0 - pong["random"]) / (pong["human"] - pong["random"])]
    assert rows[0][5].startswith(f"{np.mean(scores):.3f} [")
    assert notes == ["ALE/Tetris-v5: no human and random scores, left out of the human-normalised aggregate"]


def test_minatar_above_random_needs_an_se_on_both_sides():
    """A single seed (or a single random episode) has no SE: no verdict, never a "yes" on one run."""
    from reports.data import NO_SE
    from reports.minatar import above_random

    assert above_random(10.0, 1.0, 2.0, 1.0) == "yes"  # 8 > 3 sqrt(2)
    assert above_random(5.0, 1.0, 2.0, 1.0) == "no"  # 3 < 3 sqrt(2)
    assert above_random(10.0, float("nan"), 2.0, 1.0) == f"({NO_SE})"
    assert above_random(10.0, 1.0, 2.0, float("nan")) == "(one episode: no SE)"
    assert above_random(10.0, 1.0, float("nan"), float("nan")) == "(no baseline)"
