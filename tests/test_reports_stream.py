"""Tests of reports.stream (Table tb:sin, Figure 2a/2b from stream-sin and edit run logs) and reports.paper.

Run logs are made by the streaming learner itself (tiny settings); reports code never imports agents.
"""

import ast
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from agents.lifecycle import execute
from agents.stream.commands import COMMANDS
from runlog import RunLog, find_runs, read_run
from reports import paper, stream

ROOT = Path(__file__).resolve().parents[1]
TINY = {"seeds": "0,1,2", "n": 30, "n_test": 100, "width": 100, "probe_at": "1,15,30"}
SETTINGS = [  # (act, lr, srnn_lambda, srnn_beta)
    ("elephant", 3e-4, 0.0, 0.1), ("elephant", 1e-3, 0.0, 0.1),
    ("relu", 3e-4, 0.0, 0.1), ("relu", 1e-3, 0.0, 0.1),
    ("tanh", 1e-3, 0.1, 0.1), ("relu", 1e-3, 0.01, 0.05),
]


@pytest.fixture(scope="module")
def out_root(tmp_path_factory):
    """Run logs of SETTINGS x 3 seeds and of the edit (ReLU, Elephant) x 2 seeds, under one directory."""
    root = tmp_path_factory.mktemp("stream_runs")
    c = COMMANDS["stream-sin"]
    for act, lr, lam, beta in SETTINGS:
        cfg = c.make_config({**TINY, "act": act, "lr": lr, "srnn_lambda": lam, "srnn_beta": beta})
        execute(c.train, cfg, c.run_dir(cfg, root))
    e = COMMANDS["edit"]
    for act in ("relu", "elephant"):
        ec = e.make_config({"act": act, "seeds": "0,1", "width": 100, "pretrain_steps": 500})
        execute(e.train, ec, e.run_dir(ec, root))
    return root


@pytest.fixture(scope="module")
def runs(out_root):
    return [read_run(p) for p in find_runs(out_root)]


@pytest.fixture(scope="module")
def stream_runs(runs):
    return [r for r in runs if stream.is_stream_run(r)]


@pytest.fixture(scope="module")
def edit_runs(runs):
    return [r for r in runs if stream.is_edit_run(r)]


def summaries(out_root):
    """``{(method dir, lr): [final MSE per seed]}`` from the learner's own summary.json files."""
    out = {}
    for path in (out_root / "stream-sin").glob("*/lr*/summary.json"):
        finals = json.loads(path.read_text())["final_mse"]
        out[(path.parent.parent.name, float(path.parent.name[2:]))] = [finals[k] for k in sorted(finals, key=int)]
    return out


def by_hand(values):
    v = np.asarray(values, dtype=float)
    return v.mean(), v.std(ddof=1) / math.sqrt(len(v))


# --- the table ----------------------------------------------------------------------


def test_final_mse_is_last_test_mse(stream_runs):
    run = stream_runs[0]
    steps, values = run.scalars["test_mse"]
    assert stream.final_mse(run) == pytest.approx(values[np.argmax(steps)])
    assert int(steps.max()) == run.config["n"] == 30


@pytest.mark.parametrize("method", ["relu", "elephant"])
def test_table_picks_best_lr_with_mean_and_sem(out_root, stream_runs, method):
    table = {row.method: row for row in stream.stream_table(stream_runs)}
    sums = {lr: v for (name, lr), v in summaries(out_root).items() if name == method}
    assert len(sums) == 2
    best_lr = min(sums, key=lambda lr: np.mean(sums[lr]))
    mean, sem = by_hand(sums[best_lr])
    row = table[method]
    assert row.best_lr == pytest.approx(best_lr)
    assert row.config_label == method
    assert row.n_seeds == 3
    assert row.mean == pytest.approx(mean, rel=1e-6)
    assert row.sem == pytest.approx(sem, rel=1e-5)
    assert (row.paper_mean, row.paper_sem) == paper.SIN_TABLE[method]


def test_srnn_row_is_best_srnn_config(out_root, stream_runs):
    sums = {k: v for k, v in summaries(out_root).items() if "-srnn-" in k[0]}
    assert len(sums) == 2  # tanh l0.1 b0.1 and relu l0.01 b0.05, both at 1e-3
    (name, lr) = min(sums, key=lambda k: np.mean(sums[k]))
    act, lam, beta = re.fullmatch(r"(\w+)-srnn-l([\d.e-]+)-b([\d.e-]+)", name).groups()
    row = next(r for r in stream.stream_table(stream_runs) if r.method == "srnn")
    assert row.config_label == f"{act} lambda={float(lam):g} beta={float(beta):g}"
    assert row.best_lr == pytest.approx(lr)
    assert row.mean == pytest.approx(np.mean(sums[(name, lr)]), rel=1e-6)
    assert (row.paper_mean, row.paper_sem) == paper.SIN_TABLE["srnn"]
    # plain ReLU is selected among srnn_lambda == 0 runs only
    relu = next(r for r in stream.stream_table(stream_runs) if r.method == "relu")
    assert relu.config_label == "relu"
    assert [r.method for r in stream.stream_table(stream_runs)] == ["relu", "srnn", "elephant"]


def test_lr_sweep_lists_every_setting(out_root, stream_runs):
    sweep = stream.lr_sweep(stream_runs)
    assert len(sweep) == len(SETTINGS)
    assert all(r.n_seeds == 3 and r.seeds == (0, 1, 2) for r in sweep)
    sums = summaries(out_root)
    relu = {r.lr: r for r in sweep if r.method == "relu"}
    for lr, row in relu.items():
        assert row.mean == pytest.approx(np.mean(sums[("relu", lr)]), rel=1e-6)
        assert list(row.values) == pytest.approx(sums[("relu", lr)], rel=1e-6)
    assert [r.lr for r in sweep if r.method == "relu"] == [1e-3, 3e-4]  # large to small


def fake_stream_run(path, n=30, last=30, seed=0, act="relu", lr=1e-3):
    config = {"algo": "stream-sin", "act": act, "lr": lr, "srnn_lambda": 0, "srnn_beta": 0.1, "n": n,
              "width": 100, "seed": seed}
    with RunLog(path, config=config, seed=seed, probes={}, scalars=["test_mse"]) as log:
        for t in range(1, last + 1):
            log.scalar("test_mse", t, 1.0 / t)
    return read_run(path)


def test_unfinished_mixed_and_repeated_runs(tmp_path):
    done = fake_stream_run(tmp_path / "a.h5")
    cut = fake_stream_run(tmp_path / "b.h5", last=10, seed=1)
    assert stream.final_mse(cut) is None
    assert stream.incomplete_runs([done, cut]) == [cut.path]
    (row,) = stream.stream_table([done, cut])
    assert row.n_seeds == 1 and row.mean == pytest.approx(1 / 30) and math.isnan(row.sem)
    other = fake_stream_run(tmp_path / "c.h5", n=40, last=40, seed=2)
    with pytest.raises(ValueError, match="settings differ: n"):
        stream.stream_table([done, other])
    twin = fake_stream_run(tmp_path / "d.h5")
    with pytest.raises(ValueError, match="seed 0 .* appears twice"):
        stream.lr_sweep([done, twin])


# --- figures and the edit table -----------------------------------------------------


def test_sine_snapshots_and_panels(stream_runs):
    best = stream.best_runs(stream_runs)
    assert [label.split(" ")[0] for label in best] == ["Elephant", "ReLU", "SR-NN"]
    run = next(iter(best.values()))
    snaps = stream.sine_snapshots(run)
    assert [s.step for s in snaps] == [1, 15, 30]
    s = snaps[1]
    assert s.x.shape == s.f.shape == s.ntk.shape == (201,)
    assert np.all(np.diff(s.x) > 0) and s.x[0] == pytest.approx(0) and s.x[-1] == pytest.approx(2)
    assert s.x_t == pytest.approx(np.linspace(0, 2, 30)[14], abs=1e-6)
    assert np.max(np.abs(s.ntk)) == pytest.approx(1.0, abs=1e-4)  # normalised
    fig = stream.sine_panels(best)
    assert isinstance(fig, Figure)
    assert len([ax for ax in fig.axes if ax.has_data()]) == 3 * 3
    fig = stream.sine_panels(best, steps=[14, 30])  # nearest records: 15 and 30
    assert [ax.get_title() for ax in fig.axes if ax.has_data()][:2] == ["t = 15", "t = 30"]


def test_sine_panels_share_one_y_range_with_readable_labels(stream_runs):
    fig = stream.sine_panels(stream.best_runs(stream_runs))
    axes = [ax for ax in fig.axes if ax.has_data()]
    assert len({ax.get_ylim() for ax in axes}) == 1  # one y-range for every panel
    lo, hi = axes[0].get_ylim()
    assert lo <= -1.6 and hi >= 1.6 and -3 <= lo and hi <= 3
    # readable on a report page: six panels make a figure shown at (nearly) full size (pages scale wider images
    # down to the page), with text of at least 11 pt
    n_cols = len({ax.get_title() for ax in axes})
    assert fig.get_figwidth() / n_cols * 6 * 100 <= 1400  # pixels at the reports' 100 dpi, six steps (the default)
    for ax in axes:
        assert ax.title.get_fontsize() >= 12
        assert all(label.get_fontsize() >= 11 for label in ax.get_xticklabels() + ax.get_yticklabels())
    assert all(ax.yaxis.label.get_fontsize() >= 12 for ax in fig.axes if ax.get_ylabel())
    assert all(t.get_fontsize() >= 12 for legend in fig.legends for t in legend.get_texts())


def test_shared_ylim():
    from reports.stream.plots import shared_ylim
    assert shared_ylim([np.array([-0.5, 0.5])]) == (-1.6, 1.6)  # sin and the normalised NTK always fit
    assert shared_ylim([np.array([0.0, 2.0]), np.array([-2.0, np.nan])]) == pytest.approx((-2.1, 2.1))
    assert shared_ylim([np.array([0.0, 50.0])]) == (-1.6, 3.0)  # a diverging curve is clipped


def test_table_caption_names_the_number_of_seeds():
    assert "over 3 seeds" in stream.table_caption([3, 3])
    assert "1 seed" in stream.table_caption([1]) and "standard error" in stream.table_caption([1])
    assert "over 2–5 seeds" in stream.table_caption([2, 5])
    for caption in (stream.table_caption([3]), stream.table_caption([1]), stream.TABLE_CAPTION):
        assert not re.search(r"\b(n|1) seeds", caption)


def test_edit_table_and_figure(edit_runs):
    table = stream.edit_table(edit_runs)
    assert [r.act for r in table.rows] == ["elephant", "relu"]
    far = {a: [float(r.probes["edit"]["far_change"][0]) for r in edit_runs if r.config["act"] == a]
           for a in ("elephant", "relu")}
    for row in table.rows:
        mean, sem = by_hand(far[row.act])
        assert row.mean_far_change == pytest.approx(mean, rel=1e-6)
        assert row.sem_far_change == pytest.approx(sem, rel=1e-5)
        assert row.n_seeds == 2 and row.min_steps >= 1
    assert table.ratio == pytest.approx(np.mean(far["relu"]) / np.mean(far["elephant"]), rel=1e-6)
    assert (table.x_edit, table.target) == (1.5, -1.5)
    fig = stream.edit_figure(edit_runs)
    assert isinstance(fig, Figure) and len(fig.axes) == 3


# --- the command line ---------------------------------------------------------------


def test_cli_writes_report(out_root, tmp_path, capsys):
    out = tmp_path / "report"
    assert stream.main([str(out_root), "-o", str(out), "--seeds-note", "3 seeds, n=30 (paper: 5)"]) == 0
    printed = capsys.readouterr().out
    assert "| Method | Selected setting | Best lr |" in printed
    assert "0.4729 ± 0.0110" in printed and "0.0081 ± 0.0009" in printed and "3 seeds, n=30" in printed
    assert "ReLU / Elephant" in printed
    index = out / "index.html"
    assert str(index) in printed
    sources = re.findall(r'<img src="([^"]+)"', index.read_text())
    assert {"sine_panels.png", "test_mse.png", "edit.png"} <= set(sources)
    for src in sources:
        assert (out / src).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    md = (out / "stream_table.md").read_text()
    main_table = md.split("**Learning-rate sweep.**")[0]
    assert main_table.count("| Elephant | elephant |") == 1 and "standard error" in main_table
    assert "over 3 seeds" in main_table and not re.search(r"\bn seeds", main_table)
    assert "over 3 seeds" in index.read_text() and not re.search(r"\bn seeds", index.read_text())
    assert "test MSE after each sample (log scale)" in index.read_text()
    assert "| ReLU | relu | 0.001 |" in md and "| ReLU | relu | 0.0003 |" in md  # the sweep


def test_cli_bad_input(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert stream.main([str(empty), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {empty}: no *.h5 run logs in this directory\n"
    (empty / "junk.h5").write_text("not hdf5")
    assert stream.main([str(empty), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "junk.h5" in err and err.count("\n") == 1
    assert stream.main([str(tmp_path / "missing"), "-o", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o" / "index.html").exists()


def test_reports_do_not_import_agents():
    for path in sorted((ROOT / "reports").rglob("*.py")):
        name = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        modules += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not any(m == "agents" or m.startswith("agents.") for m in modules), name


# --- the paper's numbers ------------------------------------------------------------


def test_paper_copy():
    assert paper.table_rows("tb:sin")[-1] == ["elephant", "0.0081 +- 0.0009"]
    assert paper.table_rows("tb:activation")[1] == ["relu", "1/2", "1/2"]
    assert set(paper.SIN_TABLE) == set(paper.METHOD_NAMES)
