"""Bad input to the CLIs: exit status 2 and one line naming the problem, never a traceback or a silent run."""

from __future__ import annotations

import os

import pytest

from agents import grid, train

DQN = ["dqn", "--env", "CartPole-v1", "--act", "relu", "--hidden", "16", "--steps", "200", "--no-progress"]


def _status(main, argv: list[str], capsys) -> tuple[int, list[str]]:
    """The exit status of ``main(argv)`` and its stderr's error lines."""
    try:
        status = main(argv)
    except SystemExit as err:
        status = err.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return status, [line for line in err.splitlines() if "error" in line]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "binary.yml").write_bytes(b"\xff\xfe seed: 1")
    (tmp_path / "syntax.yml").write_text("act: [relu,\n  seed: 1\n")
    os.mkfifo(tmp_path / "fifo.yml")
    return tmp_path


@pytest.mark.parametrize("flags, words", [
    (["--set", "gamma=[1,"], "--set gamma: '[1,' is not a valid YAML value"),
    (["--config", "{dir}/binary.yml"], "is not UTF-8 text"),
    (["--config", "{dir}/syntax.yml"], "is not valid YAML: expected ',' or ']'"),
    (["--config", "{dir}/fifo.yml"], "not a regular file"),
    (["--config", "{dir}/missing.yml"], "no such file"),
    (["--seed", "4294967296"], "seed must be an integer from 0 to 4,294,967,295"),
    (["--steps", "1e30"], "n_timesteps must be an integer from 1 to"),
    (["--hidden", "1000000000"], "net_arch must be an integer from 1 to 16,777,216"),
    (["--hidden", "100000,100000,100000"], "at most 4,294,967,296 weights"),
    (["--set", "replay=frames"], "replay=frames stores stacks of image frames; CartPole-v1 observes (4,)"),
    (["--set", "env_kwargs={render_mode: human}"], "without render_mode"),
])
def test_train_refuses_bad_input_in_one_line(tmp_path, files, capsys, flags, words):
    flags = [f.replace("{dir}", str(files)) for f in flags]
    status, errors = _status(train.main, [*DQN, "--out", str(tmp_path / "runs"), *flags], capsys)
    assert status == 2 and len(errors) == 1 and words in errors[0], errors
    assert not list((tmp_path / "runs").rglob("run.h5"))  # nothing ran


@pytest.mark.parametrize("flags, words", [
    (["--seeds", "abc"], "--seeds takes integers and ranges, e.g. 0-4 or 0,2,5; got 'abc'"),
    (["--seeds", "5-2"], "--seeds: the range '5-2' is empty"),
    (["--seeds", "4294967296"], "seeds must be distinct integers from 0 to 4294967295"),
    (["--seeds", "0-2", "--seed", "1"], "give --seed or --seeds, not both"),
])
def test_seeds_refuses_bad_input_in_one_line(tmp_path, capsys, flags, words):
    status, errors = _status(train.main, ["dqn", "--env", "Acrobot-v1", "--act", "relu", "--steps", "100", "--out",
                                          str(tmp_path), *flags], capsys)
    assert status == 2 and len(errors) == 1 and words in errors[0], errors


@pytest.mark.parametrize("text, flags, words", [
    ("command: dqn\nfixed: {env: CartPole-v1, steps: 200}\ngrid:\n  - {seed: [0]}\n", ["--axis", "seed=5-2"],
     "--axis: the range '5-2' is empty"),
    ("command: dqn\nfixed: {env: CartPole-v1, steps: 200}\ngrid:\n  - {seed: [0]}\n", ["--axis", "gamma=[1,"],
     "--axis: '[1' is not a valid YAML value"),
    ("command: dqn\nfixed: {env: [1,\n", [], "is not valid YAML: expected the node content"),
])
def test_grid_refuses_bad_input_in_one_line(tmp_path, capsys, text, flags, words):
    (tmp_path / "grid.yml").write_text(text)
    status, errors = _status(grid.main, [str(tmp_path / "grid.yml"), "--out", str(tmp_path / "runs"), "--dry-run",
                                         *flags], capsys)
    assert status == 2 and len(errors) == 1 and words in errors[0], errors
