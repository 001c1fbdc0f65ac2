"""``python -m agents.train``'s help and messages: the probes ``--probe`` takes (every registered one, plugins'
included, with a line each from its docstring) and the run folder every run names at its start."""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout

import pytest

from agents.commands import first_sentence, probe_list
from agents.train import build_parser, main
from probes import PROBES, Probe


def _format(command: str) -> str:
    parser = build_parser(command)
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return sub.format_help()


@pytest.mark.parametrize("command", ["dqn", "rainbow", "ppo", "sac", "stream-sin", "class-inc"])
def test_probe_help_lists_every_registered_probe_with_its_docstring(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    text = _format(command)
    listed = re.findall(r"^    (\w+) +(\S.*)$", text, flags=re.M)
    assert [name for name, _ in listed] == list(PROBES)  # gradcov, ntk, outputs, sparsity, weights, plasticity
    assert {"gradcov", "ntk", "outputs", "sparsity", "weights", "plasticity"} <= set(PROBES)
    for name, line in listed:
        assert line == first_sentence(PROBES[name].__doc__) and line, (name, line)
        assert "``" not in line and ":mod:" not in line
    assert "--probe NAMES" in text and "gradcov, ntk, sparsity, weights, ..." not in text


def test_a_plugins_probe_is_listed(monkeypatch):
    class EchoProbe(Probe):
        """Echoes ``x``: a test probe, e.g. for the help. Not this sentence."""

        name = "echo"

    monkeypatch.setitem(PROBES, "echo", EchoProbe)
    monkeypatch.setenv("COLUMNS", "160")
    assert re.search(r"^    echo +Echoes x: a test probe, e\.g\. for the help$", _format("dqn"), flags=re.M)


def test_first_sentences_of_docstrings_that_open_a_list_or_run_on():
    assert first_sentence("""Per layer, on the inputs:

    * ``activation_sparsity``: fraction of outputs;
    * ``effective_rank`` and ``srank`` (of the features): ranks.
    """) == "Per layer, on the inputs: activation_sparsity, effective_rank, srank"
    long = "Per tensor: its norm and the norm of its ``.grad`` (NaN at first); per layer of an activation " \
           "whose spec declares per-unit parameters (Elephant's ``h``): each as (mean, min, max)."
    assert first_sentence(long) == "Per tensor: its norm and the norm of its .grad (NaN at first)"
    assert first_sentence(None) == "" and first_sentence("The model's outputs (:mod:`x.y`).") == \
        "The model's outputs (x.y)"


def test_the_probe_list_wraps_under_its_descriptions_on_narrow_terminals():
    lines = probe_list(width=60).splitlines()
    assert all(len(line) <= 60 for line in lines)
    assert all(re.match(r"  \w+ +\S| {14}\S", line) for line in lines), lines


def test_every_run_names_its_folder_first(tmp_path, capsys):
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["dqn", "--env", "CartPole-v1", "--hidden", "16", "--steps", "300", "--set", "learning_starts=100",
                     "--no-progress", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    run_dir = json.loads(buf.getvalue())["run_dir"]
    assert "n_timesteps=300" in run_dir and run_dir.startswith(str(tmp_path / "dqn" / "CartPole-v1" / "elephant"))
    assert err.splitlines()[0] == f"run folder: {run_dir}", err
