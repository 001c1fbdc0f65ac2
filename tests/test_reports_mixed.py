"""A report over mixed runs: DQN and PPO on CartPole, PPO and SAC on Pendulum, 3 seeds each, tiny.

The report must give one section per (algorithm, env), short labels, no matplotlib warning, PDFs beside the PNGs,
and colour maps that fit the values.
"""

from __future__ import annotations

import re
import warnings
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from agents.commands import get_command
from runlog import read_run
from reports.build import build_report
from reports.data import MAX_LABEL, partition, short_labels
from reports.plots import group_colors, heatmap_scale

#: (algorithm, flags): tiny runs with the probes a report draws (gradient covariance, NTK, sparsity, weights)
RUNS = [
    ("dqn", {"env": "CartPole-v1", "steps": 400, "set": ["learning_starts=50"]}),
    ("ppo", {"env": "CartPole-v1", "steps": 512, "set": ["n_epochs=1"]}),
    ("ppo", {"env": "Pendulum-v1", "steps": 256, "set": ["n_steps=64", "n_epochs=1", "n_envs=2"]}),
    ("sac", {"env": "Pendulum-v1", "steps": 300, "set": ["learning_starts=100"]}),
]
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """12 run folders under one root, as ``agents.train`` writes them."""
    from agents.rl.run import train

    root = tmp_path_factory.mktemp("runs")
    for algo, flags in RUNS:
        cmd = get_command(algo)
        for seed in SEEDS:
            config = cmd.make_config({**flags, "set": [*flags["set"], "probe_inputs=8"], "seed": seed, "hidden": "16",
                                      "probe": "gradcov,ntk,sparsity,weights", "probe_every": 100,
                                      "checkpoint_every": 0, "progress": False})
            train(config, cmd.run_dir(config, root))
    return root


class _Page(HTMLParser):
    """Headings (level, text, id), table cells per table, image sources and links of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[tuple[int, str, str | None]] = []
        self.tables: list[list[list[str]]] = []
        self.images: list[str] = []
        self.links: list[str] = []
        self._tag: str | None = None
        self._id: str | None = None
        self._text = ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("h1", "h2", "h3"):
            self._tag, self._id, self._text = tag, attrs.get("id"), ""
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._tag, self._text = tag, ""
        elif tag == "img":
            self.images.append(attrs["src"])
        elif tag == "a":
            self.links.append(attrs["href"])

    def handle_data(self, data):
        if self._tag:
            self._text += data

    def handle_endtag(self, tag):
        if tag in ("h1", "h2", "h3") and self._tag == tag:
            self.headings.append((int(tag[1]), self._text, self._id))
            self._tag = None
        elif tag in ("td", "th") and self._tag == tag:
            self.tables[-1][-1].append(self._text)
            self._tag = None


def test_a_report_over_mixed_runs_has_a_section_per_algorithm_and_env(mixed, tmp_path):
    runs = [read_run(p) for p in sorted(mixed.rglob("run.h5"))]
    assert len(runs) == 12
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no matplotlib (or other) warning while the report is built
        index = build_report(runs, tmp_path / "report")
    page = _Page()
    page.feed(index.read_text())
    parts = [text for level, text, _ in page.headings if level == 2]
    assert parts == ["DQN on CartPole-v1", "PPO on CartPole-v1", "PPO on Pendulum-v1", "SAC on Pendulum-v1"]
    assert all(f"#{anchor}" in page.links for level, _, anchor in page.headings if level == 2)
    configurations = [t for t in page.tables if t[0][0] == "configuration"]
    assert len(configurations) == 4
    labels = [row[0] for table in configurations for row in table[1:]]  # (a settings column only for long labels)
    labels += [row[1] for table in page.tables for row in table[1:] if table[0][0] == "file"]
    assert labels and all(0 < len(label) < 60 for label in labels), labels
    runs_tables = [t for t in page.tables if t[0][0] == "file"]
    assert all(len(t[0]) <= 8 for t in runs_tables)  # a readable Runs table, not one column per setting
    assert sum(len(t) - 1 for t in runs_tables) == 12
    assert all((tmp_path / "report" / src).exists() and (tmp_path / "report" / src).with_suffix(".pdf").exists()
               for src in page.images)
    assert not any("run_end" in src for src in page.images)  # the internal end code is no figure
    text = index.read_text()
    assert "Efficient Reinforcement Learning by Reducing Forgetting with Elephant Activation Functions" in text


def test_labels_are_short_and_colours_follow_the_activation():
    long = "act=elephant " + "x" * 80
    assert short_labels(["act=relu", long]) == {"act=relu": "act=relu", long: "config 2"}
    assert MAX_LABEL < 61
    assert group_colors({"a": "elephant", "b": "relu"})["a"] == group_colors({"b": "relu", "a": "elephant"})["a"]
    assert group_colors({"x": "elephant", "y": "elephant"}) == {"x": "C0", "y": "C1"}


def test_a_kernel_of_positive_entries_gets_a_sequential_map_and_a_signed_one_a_diverging_map():
    assert heatmap_scale(np.array([[1.0, 0.5], [0.5, 2.0]])) == ("viridis", 0.0, 2.0)
    assert heatmap_scale(np.array([[1.0, -3.0], [0.5, 2.0]])) == ("RdBu_r", -3.0, 3.0)


def test_runs_are_split_by_algorithm_and_env_and_streaming_runs_by_command(mixed):
    runs = [read_run(p) for p in sorted(mixed.rglob("run.h5"))]
    assert {k: len(v) for k, v in partition(runs).items()} == {
        "DQN on CartPole-v1": 3, "PPO on CartPole-v1": 3, "PPO on Pendulum-v1": 3, "SAC on Pendulum-v1": 3}


def test_the_showcase_page_has_real_captions_links_and_the_citation(tmp_path):
    from agents.showcase import run

    index = run(tmp_path / "showcase", "0")
    page = _Page()
    page.feed(index.read_text())
    assert {"stream/index.html", "probes/index.html"} <= set(page.links)
    assert all((tmp_path / "showcase" / link).exists() for link in page.links if not link.startswith("#"))
    captions = re.findall(r"<figcaption>([^<]*)</figcaption>", index.read_text())
    stems = {Path(src).stem.replace("_", " ") for src in page.images}
    assert captions and not stems & set(captions)  # captions say what a figure shows, not its file name
    assert all((tmp_path / "showcase" / src).exists() for src in page.images)
    assert "local-editing.md reports 5 seeds" in index.read_text() and "Vasan" in index.read_text()


def test_ntk_against_distance_bins_the_normalised_kernel_of_every_run():
    """Two inputs at distance 1 and a third far away: the normalised kernel of the near pair lands in the first
    bin, the far pairs in the last; a second run with another kernel gives the mean and the standard error."""
    from runlog import Run
    from reports.data import ntk_vs_distance

    x = np.array([[0.0], [1.0], [10.0]])

    def run(k_far: float) -> Run:
        kernel = np.array([[4.0, 2.0, k_far], [2.0, 4.0, k_far], [k_far, k_far, 4.0]])[None]
        return Run("r.h5", {}, 0, {}, {"inputs": {"step": np.array([0]), "x": x[None]},
                                       "ntk": {"step": np.array([100]), "kernel": kernel}}, {})

    curve = ntk_vs_distance([run(0.0), run(2.0)], bins=2)
    assert curve.step == 100 and curve.steps.tolist() == [2.5, 7.5]
    assert curve.values.tolist() == [[0.5, 0.0], [0.5, 0.5]]
    assert curve.mean.tolist() == [0.5, 0.25] and curve.sem[0] == 0.0
