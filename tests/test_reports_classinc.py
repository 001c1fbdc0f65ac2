"""Tests of reports.classinc (the class-incremental tables tb:mnist/tb:cifar, accuracy curves, accuracy matrices,
forgetting and probes between tasks) on synthetic class-inc run logs with known values.

The logs are written with runlog.RunLog in the layout ``python -m agents.train class-inc`` uses, so the
tests need neither the learner nor a dataset.
"""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from runlog import Field, RunLog, find_runs, read_run
from reports import classinc

TASKS = [[0, 1], [2, 3], [4, 5]]
PER_TASK = 100  # training samples per task: task ends at 100, 200, 300
BASE = {"algo": "class-inc", "command": "class-inc", "data": "split-digits", "data_root": None, "model": "mlp",
        "act": "relu", "width": 1000, "layer_norm": None, "sigma_bias": None, "d": 4.0, "a": 0.08, "h": 1.0,
        "conv_channels": 64, "lr": 1e-3, "batch_size": 10, "updates": 1, "ewc_lambda": 0.0, "ewc_gamma": 0.99,
        "classes_per_task": 2, "class_order": "fixed", "eval_every": 4, "eval_samples": 0, "seeds": None,
        "probe": ["gradcov", "sparsity"], "device": "cpu", "tasks": TASKS}
METHODS = {"mlp-relu": {"act": "relu"}, "mlp-relu-ewc": {"act": "relu", "ewc_lambda": 10.0},
           "mlp-elephant": {"act": "elephant", "layer_norm": True, "sigma_bias": 0.4}}
#: final accuracy per seed of each (method, lr); mlp-elephant lr 1e-4 has the highest mean but only 2 seeds
FINAL = {("mlp-relu", 1e-3): [0.50, 0.55, 0.60], ("mlp-relu", 1e-4): [0.40, 0.45, 0.47],
         ("mlp-relu-ewc", 1e-3): [0.60, 0.62, 0.58], ("mlp-relu-ewc", 1e-4): [0.70, 0.66, 0.65],
         ("mlp-elephant", 1e-3): [0.80, 0.78, 0.79], ("mlp-elephant", 1e-4): [0.90, 0.95]}
OFFSET = {"mlp-relu": 0.0, "mlp-relu-ewc": 0.05, "mlp-elephant": 0.1}
GRADCOV = {"nll": Field((4, 4)), "nll_offdiag_mean": Field(()), "nll_negative_fraction": Field(()),
           "nll_negative_mass": Field(()), "nll_positive_mass": Field(())}
SPARSITY = {k: Field((2,)) for k in ("activation_sparsity", "gradient_sparsity", "dormant", "saturated")}


def matrix(method, seed):
    """The accuracy matrix A[k, j] written for `method` and `seed` (upper triangle: unseen tasks, 0)."""
    o = OFFSET[method]
    return np.array([[0.9 + 0.01 * seed, 0.0, 0.0],
                     [0.5, 0.8 + o, 0.0],
                     [0.2 + 0.05 * seed, 0.3, 0.7]])


def negative_mass(method, seed, k):
    return 0.1 * (k + 1) + OFFSET[method] + 0.001 * seed


def last_sparsity(method, seed, k):
    return 0.5 + OFFSET[method] + 0.01 * k + 0.001 * seed


def write_run(root, method, lr, seed, end="finished", final=None, probes=True, data="split-digits", every_task=True):
    """One synthetic run log; `end`: ``"finished"`` (with `final`), ``"nan"``/``"interrupted"`` (stopped in task 1,
    no final accuracy) or None (killed in task 1: no run_end). `every_task` false: ``task_acc_<j>`` only at the last
    task's end (a learner that missed the task ends)."""
    config = {**BASE, **METHODS[method], "lr": lr, "seed": seed, "data": data}
    path = (Path(root) / "class-inc" / data / method / "w1000-bs10" / f"lr{lr:g}-E1" / f"seed{seed}" / "run.h5")
    decl = {"gradcov": GRADCOV, "sparsity": SPARSITY} if probes else {}
    scalars = ["test_acc", "train_loss", "final_acc", "run_end", *(f"task_acc_{j}" for j in range(len(TASKS)))]
    stop = len(TASKS) * PER_TASK if end == "finished" else 150
    a = matrix(method, seed)
    with RunLog(path, config=config, seed=seed, probes=decl, scalars=scalars, overwrite=True,
                probe_settings={"sparsity": {"layers": ["features.0", "features.2"]}}) as log:
        for step in range(20, stop + 1, 10):
            log.scalar("train_loss", step, 1.0 / step)
            if step % 20 == 0:
                log.scalar("test_acc", step, 0.9 - step / 1000 + 0.01 * seed + OFFSET[method])
            if step % PER_TASK == 0:
                k = step // PER_TASK - 1
                for j in range(len(TASKS) if every_task or k == len(TASKS) - 1 else 0):
                    log.scalar(f"task_acc_{j}", step, a[k, j])
                if probes:
                    log.append("gradcov", step, nll=np.eye(4), nll_offdiag_mean=0.0, nll_negative_fraction=0.5,
                               nll_negative_mass=negative_mass(method, seed, k), nll_positive_mass=0.5)
                    sp = np.array([0.05, last_sparsity(method, seed, k)])
                    log.append("sparsity", step, activation_sparsity=sp, gradient_sparsity=sp, dormant=sp,
                               saturated=sp)
        if end == "finished":
            log.scalar("final_acc", stop, final)
        if end is not None:
            log.end(stop, end)
    return path


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("classinc_runs")
    for (method, lr), finals in FINAL.items():
        for seed, final in enumerate(finals):
            write_run(root, method, lr, seed, final=final)
    bad = {"nan": write_run(root, "mlp-relu", 1e-3, 3, end="nan"),
           "interrupted": write_run(root, "mlp-relu", 1e-3, 4, end="interrupted"),
           "killed": write_run(root, "mlp-relu-ewc", 1e-4, 5, end=None)}
    (root / "bad.json").write_text(json.dumps({k: str(v) for k, v in bad.items()}))
    return root


@pytest.fixture(scope="module")
def runs(runs_root):
    return [read_run(p) for p in find_runs(runs_root)]


@pytest.fixture(scope="module")
def rows(runs):
    return classinc.sweep(runs)


def bad_paths(runs_root):
    return json.loads((runs_root / "bad.json").read_text())


def row_of(rows, method, lr):
    return next(r for r in rows if r.method == method and r.hyper["lr"] == lr)


def by_hand(values):
    v = np.asarray(values, dtype=float)
    return v.mean(), v.std(ddof=1) / math.sqrt(len(v))


# --- the paper's numbers ------------------------------------------------------------


def test_reference_has_both_tables_and_widths():
    ref = classinc.reference_data()
    assert set(ref["datasets"]) == {"split-mnist", "split-cifar10"}
    for dataset in ("split-mnist", "split-cifar10"):
        assert set(ref[dataset]) == {"1000", "10000"}
        for width in ("1000", "10000"):
            assert {"MLP", "MLP+Streaming EWC", "EMLP", "CNN", "CNN+Streaming EWC", "ECNN", "ConvMixer",
                    "EConvMixer"} <= set(ref[dataset][width])
    assert ref["split-mnist"]["1000"]["EMLP"] == [0.723, 0.006]
    assert ref["split-mnist"]["10000"]["SDMLP"] == [0.53, None]
    assert ref["split-cifar10"]["10000"]["ECNN"] == [0.243, 0.002]
    assert ref["passes"] == {"SDMLP": 500} and ref["task_boundary"] == ["FlyModel"]
    text = " ".join(ref["notes"])
    assert "500 passes" in text and "task boundaries" in text
    assert classinc.paper_value("split-digits", 1000, "mlp-elephant") == (0.723, 0.006)
    assert classinc.paper_value("split-cifar10", 10000, "cnn-relu-ewc") == (0.179, 0.007)
    assert classinc.paper_value("embed", 1000, "mlp-relu") is None
    assert classinc.paper_value("split-mnist", 500, "mlp-relu") is None


# --- which runs count ---------------------------------------------------------------


def test_method_names():
    assert [classinc.method_name(m) for m in classinc.METHOD_NAMES] == [
        "MLP", "MLP+Streaming EWC", "EMLP", "CNN", "CNN+Streaming EWC", "ECNN"]
    assert classinc.method_name("mlp-tanh-ewc") == "mlp-tanh+Streaming EWC"
    assert classinc.method_name("cnn-tanh") == "cnn-tanh"
    assert classinc.method_of({"model": "cnn", "act": "elephant", "ewc_lambda": 0.0}) == "cnn-elephant"
    assert classinc.method_of({"model": "mlp", "act": "relu", "ewc_lambda": 100}) == "mlp-relu-ewc"


def test_incomplete_runs_are_listed_and_left_out(runs_root, runs, rows):
    usable, left = classinc.usable_runs(runs)
    bad = bad_paths(runs_root)
    reasons = {x.path: x.reason for x in left}
    assert set(reasons) == set(bad.values())
    assert reasons[bad["nan"]].startswith("diverged")
    assert reasons[bad["interrupted"]].startswith("interrupted")
    assert reasons[bad["killed"]].startswith("unfinished")
    assert len(usable) == sum(len(v) for v in FINAL.values())
    counted = {r.path for row in rows for r in row.runs}
    assert not counted & set(bad.values())
    assert classinc.exclusion(next(r for r in runs if r.path == bad["nan"])) is not None
    assert all(classinc.exclusion(r) is None for r in usable)


def test_a_repeated_setting_and_seed_counts_once(runs_root, runs):
    twin = read_run(find_runs(runs_root / "class-inc" / "split-digits" / "mlp-relu" / "w1000-bs10" / "lr0.001-E1"
                              / "seed0")[0])
    twin.path = str(runs_root / "zz_copy" / "run.h5")  # sorts after the original: the original is kept
    usable, left = classinc.usable_runs([*runs, twin])
    assert len(usable) == sum(len(v) for v in FINAL.values())
    assert any(x.path == twin.path and "counted once" in x.reason for x in left)


# --- the sweep and the selection ----------------------------------------------------


def test_sweep_lists_every_setting_with_mean_and_sem(rows):
    assert len(rows) == len(FINAL)
    for (method, lr), finals in FINAL.items():
        row = row_of(rows, method, lr)
        mean, sem = by_hand(finals)
        assert (row.data, row.width) == ("split-digits", 1000)
        assert row.n_seeds == len(finals) and row.seeds == tuple(range(len(finals)))
        assert row.values == pytest.approx(finals)
        assert row.mean == pytest.approx(mean)
        assert row.sem == pytest.approx(sem)
        assert row.expected_seeds == 3
        assert row.flagged == (len(finals) < 3)
    relu = row_of(rows, "mlp-relu", 1e-3)
    assert relu.mean == pytest.approx(0.55) and relu.sem == pytest.approx(0.05 / math.sqrt(3))
    # the paper's method order, then the highest mean first
    assert [(r.method, r.hyper["lr"]) for r in rows] == [
        ("mlp-relu", 1e-3), ("mlp-relu", 1e-4), ("mlp-relu-ewc", 1e-4), ("mlp-relu-ewc", 1e-3),
        ("mlp-elephant", 1e-4), ("mlp-elephant", 1e-3)]


def test_hyper_parameters_shown_where_they_apply(rows):
    relu, ewc, eleph = (row_of(rows, m, 1e-3) for m in ("mlp-relu", "mlp-relu-ewc", "mlp-elephant"))
    assert relu.hyper == {"lr": 1e-3, "updates": 1, "sigma_bias": None, "layer_norm": None}
    assert ewc.hyper["ewc_lambda"] == 10.0 and ewc.hyper["ewc_gamma"] == 0.99 and "a" not in ewc.hyper
    assert eleph.hyper["a"] == 0.08 and eleph.hyper["layer_norm"] is True and eleph.hyper["sigma_bias"] == 0.4
    assert all(r.other == "" for r in rows)  # nothing else differs


def test_best_setting_per_method(rows):
    best = {r.method: r for r in classinc.best_settings(rows)}
    assert list(best) == ["mlp-relu", "mlp-relu-ewc", "mlp-elephant"]
    assert best["mlp-relu"].hyper["lr"] == 1e-3
    assert best["mlp-relu-ewc"].hyper["lr"] == 1e-4
    assert best["mlp-relu-ewc"].mean == pytest.approx(np.mean([0.70, 0.66, 0.65]))
    # mlp-elephant lr 1e-4 has the highest mean (0.925) but 2 seeds where most settings have 3: not selected
    assert best["mlp-elephant"].hyper["lr"] == 1e-3
    assert best["mlp-elephant"].mean == pytest.approx(0.79) and best["mlp-elephant"].sem == pytest.approx(
        0.01 / math.sqrt(3))
    # a method whose every setting is flagged still gets one
    only = classinc.best_settings([r for r in rows if r.flagged])
    assert [(r.method, r.hyper["lr"], r.n_seeds) for r in only] == [("mlp-elephant", 1e-4, 2)]


# --- the accuracy matrix and forgetting ---------------------------------------------


def test_accuracy_matrix_of_a_run(rows):
    row = row_of(rows, "mlp-relu-ewc", 1e-3)
    for run in row.runs:
        assert classinc.accuracy_matrix(run) == pytest.approx(matrix("mlp-relu-ewc", run.seed))
        assert classinc.task_ends(run).tolist() == [100, 200, 300]


def test_forgetting_by_hand():
    a = matrix("mlp-relu", 1)  # [[.91, 0, 0], [.5, .8, 0], [.25, .3, .7]]
    avg, per_task = classinc.forgetting(a)
    assert per_task == pytest.approx([0.91 - 0.25, 0.8 - 0.3])
    assert avg == pytest.approx((0.66 + 0.5) / 2)
    assert math.isnan(classinc.forgetting(np.array([[0.9]]))[0])


def test_forgetting_table_over_seeds(rows):
    table = {f.row.method: f for f in classinc.forgetting_table(classinc.best_settings(rows))}
    f = table["mlp-relu"]
    # seeds 0, 1, 2: ((0.9 + .01s) - (0.2 + .05s) + (0.8 - 0.3)) / 2 = 0.60, 0.58, 0.56
    assert f.per_seed == pytest.approx([0.60, 0.58, 0.56])
    assert f.forgetting == pytest.approx(0.58)
    assert f.forgetting_sem == pytest.approx(0.02 / math.sqrt(3))
    assert f.per_task == pytest.approx([0.91 - 0.25, 0.5])
    assert f.mean == pytest.approx(np.mean([matrix("mlp-relu", s) for s in range(3)], axis=0))
    assert f.matrices.shape == (3, 3, 3)
    e = table["mlp-elephant"]  # offset 0.1 on A[1, 1]: forgetting ((0.7 - .04s) + 0.6) / 2
    assert e.per_seed == pytest.approx([0.65, 0.63, 0.61])


def test_missing_task_end_records_give_no_matrix(tmp_path):
    for seed, final in enumerate((0.5, 0.6)):
        write_run(tmp_path / "runs", "mlp-relu", 1e-3, seed, final=final, every_task=False)
    rows = classinc.sweep([read_run(p) for p in find_runs(tmp_path / "runs")])
    assert classinc.forgetting_table(rows) == []
    assert [(r.method, n, k) for r, n, k in classinc.incomplete_matrices(rows)] == [("mlp-relu", 1, 3)]
    index = classinc.build_classinc_report([read_run(p) for p in find_runs(tmp_path / "runs")], tmp_path / "out")
    assert ("No accuracy matrix or forgetting for MLP: its run logs hold 1 of the 3 task-end records"
            in index.read_text())
    assert not (tmp_path / "out" / "matrix_split-digits_w1000.png").exists()


# --- curves and probes --------------------------------------------------------------


def test_accuracy_curve_and_task_ends(rows):
    row = row_of(rows, "mlp-relu", 1e-3)
    curve = classinc.accuracy_curve(row.runs)
    assert curve.values.shape == (3, 15)  # test_acc every 20 samples from 20 to 300
    assert curve.steps[0] == 20 and curve.steps[-1] == 300
    assert curve.mean[-1] == pytest.approx(0.9 - 0.3 + 0.01)
    assert classinc.mean_task_ends(row.runs).tolist() == [100, 200, 300]


def test_task_probes_take_the_last_layer(rows):
    row = row_of(rows, "mlp-elephant", 1e-3)
    sp = classinc.task_probe(row.runs, "sparsity", "activation_sparsity")
    assert sp.steps.tolist() == [1, 2, 3]
    expect = [[last_sparsity("mlp-elephant", s, k) for k in range(3)] for s in range(3)]
    assert sp.values == pytest.approx(np.array(expect), abs=1e-6)  # float32 in the log
    gc = classinc.task_probe(row.runs, "gradcov", "nll_negative_mass")
    assert gc.mean == pytest.approx([np.mean([negative_mass("mlp-elephant", s, k) for s in range(3)])
                                     for k in range(3)], abs=1e-6)
    assert classinc.task_probe(row.runs, "weights", "norm") is None


def test_figures(rows):
    best = classinc.best_settings(rows)
    for fig in (classinc.accuracy_figure(best), classinc.probe_figure(best),
                classinc.matrix_figure(classinc.forgetting_table(best))):
        assert isinstance(fig, Figure)
    acc = classinc.accuracy_figure(best)
    ax = acc.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["MLP (n=3)", "MLP+Streaming EWC (n=3)",
                                                                  "EMLP (n=3)"]
    assert sum(1 for line in ax.get_lines() if line.get_linestyle() == ":") == 2  # boundaries between 3 tasks
    assert len(classinc.probe_figure(best).axes) == 2
    assert len(classinc.matrix_figure(classinc.forgetting_table(best)).axes) == 3 + 1  # panels + colorbar


def test_probe_panels_skipped_without_probes(tmp_path):
    for seed, final in enumerate((0.5, 0.6)):
        write_run(tmp_path, "mlp-relu", 1e-3, seed, final=final, probes=False)
    rows = classinc.sweep([read_run(p) for p in find_runs(tmp_path)])
    assert classinc.probe_figure(rows) is None
    assert classinc.accuracy_figure(rows) is not None


# --- the report and the command line ------------------------------------------------


def test_report_written(runs_root, tmp_path, capsys):
    out = tmp_path / "report"
    assert classinc.main([str(runs_root), "-o", str(out)]) == 0
    printed = capsys.readouterr()
    for path in bad_paths(runs_root).values():
        assert f"left out {path}" in printed.err
    slug = "split-digits_w1000"
    for name in ("index.html", "class_inc_tables.md", f"accuracy_{slug}.png", f"accuracy_{slug}.pdf",
                 f"matrix_{slug}.png", f"matrix_{slug}.pdf", f"probes_{slug}.png", f"probes_{slug}.pdf"):
        assert (out / name).stat().st_size > 0, name
    md = (out / "class_inc_tables.md").read_text()
    assert md in printed.out
    page = (out / "index.html").read_text()
    for text in (md, page):
        assert "0.550 ± 0.029" in text  # MLP at lr 1e-3: mean 0.55, SE 0.05 / sqrt(3)
        assert "0.790 ± 0.006" in text  # EMLP
        assert "0.723 ± 0.006" in text  # the paper's EMLP, Split MNIST, 1K
        assert "0.580 ± 0.012" in text  # MLP's average forgetting
        assert "2 (fewer than 3)" in text  # the flagged setting
        assert "Split MNIST (tb:mnist), width 1000 (not split-digits)" in text
        assert "Split CIFAR-10 (tb:cifar), width 1000" in text
        assert "500 dataset passes" in text and "uses task boundaries" in text
        for path in bad_paths(runs_root).values():
            assert path in text
    best_table = md.split("**Final accuracy at each method's selected setting.**")[1].split("**")[0]
    emlp = next(line for line in best_table.splitlines() if line.startswith("| EMLP |"))
    assert re.search(r"\| 0\.001 \| 1 \| 0\.08 \| 0\.4 \| yes \| – \| – \|", emlp)
    assert f'src="accuracy_{slug}.png"' in page and f'src="matrix_{slug}.png"' in page
    assert "orientation only" in page


def test_no_runs_is_an_error(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert classinc.main([str(empty), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and "python -m agents.train class-inc" in err
    other = tmp_path / "other"
    with RunLog(other / "run.h5", config={"algo": "dqn", "env": "CartPole-v1"}, seed=0, probes={},
                scalars=["episode_return"]) as log:
        log.scalar("episode_return", 10, 1.0)
    assert classinc.main([str(other), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(other) in err and "no class-inc run logs" in err and "python -m agents.train class-inc" in err
    assert classinc.main([str(tmp_path / "missing"), "-o", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o" / "index.html").exists()


def test_only_incomplete_runs_is_an_error(tmp_path, capsys):
    path = write_run(tmp_path / "runs", "mlp-relu", 1e-3, 0, end="nan")
    assert classinc.main([str(tmp_path / "runs"), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no complete class-inc runs" in err and str(path) in err and "diverged" in err
