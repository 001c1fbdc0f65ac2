"""A registered activation's own arguments are flags and config keys of ``stream-sin``, ``edit`` and ``class-inc``."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from agents.classinc.commands import COMMANDS as CLASSINC
from agents.errors import ConfigError
from agents.stream.commands import COMMANDS as STREAM
from agents.train import main
from interference import ActArg, ActivationSpec, register_activation
from runlog import read_run

SPECS = importlib.import_module("interference.activation_spec")  # (the package's activation_spec is the function)

BUILT: list[float] = []  # the slope of every module built


class Slope(nn.Module):
    """``x`` for ``x > 0``, ``slope * x`` below."""

    def __init__(self, slope: float = 1.0) -> None:
        super().__init__()
        self.slope = slope
        BUILT.append(slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, x, self.slope * x)


@pytest.fixture
def slope_activation(monkeypatch: pytest.MonkeyPatch) -> None:
    """``test_slope`` registered for one test (in a copy of the registry)."""
    monkeypatch.setattr(SPECS, "_SPECS", dict(SPECS._SPECS))
    register_activation(ActivationSpec("test_slope", Slope, {"slope": ActArg(float, "slope below zero")}))
    BUILT.clear()


def _main(capsys: pytest.CaptureFixture, *args: str) -> dict:
    assert main(list(args)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_stream_sin_takes_the_activations_own_flag(slope_activation, tmp_path: Path, capsys) -> None:
    summary = _main(capsys, "stream-sin", "--act", "test_slope", "--slope", "0.5", "--n", "20", "--n-test", "50",
                    "--width", "16", "--probe", "", "--out", str(tmp_path))
    assert summary["mean_final_mse"] >= 0
    assert BUILT and set(BUILT) == {0.5}
    run = read_run(tmp_path / "stream-sin" / "test_slope-slope0.5" / "lr0.0003" / "seed0" / "run.h5")
    assert run.config["slope"] == 0.5


def test_stream_config_keys_of_the_activation(slope_activation) -> None:
    cmd = STREAM["stream-sin"]
    assert cmd.make_config({"act": "test_slope", "slope": 2, "width": 8})["slope"] == 2.0  # a YAML int: a float
    with pytest.raises(ConfigError, match="slope must be a number"):
        cmd.make_config({"act": "test_slope", "slope": "steep", "width": 8})
    with pytest.raises(ConfigError, match="'relu' does not take slope"):
        cmd.make_config({"act": "relu", "slope": 0.5, "width": 8})
    assert STREAM["edit"].make_config({"act": "test_slope", "slope": 0.5, "width": 8})["slope"] == 0.5
    elephant = cmd.make_config({"act": "elephant", "d": 4, "width": 8})
    assert elephant["d"] == 4 and "slope" not in elephant


def test_class_inc_takes_the_activations_own_flag(slope_activation, tmp_path: Path, capsys) -> None:
    summary = _main(capsys, "class-inc", "--act", "test_slope", "--slope", "0.25", "--width", "16", "--probe", "",
                    "--out", str(tmp_path))
    assert summary["status"] == "finished"
    assert BUILT and set(BUILT) == {0.25}
    (path,) = tmp_path.glob("class-inc/split-digits/mlp-test_slope/w16-bs10/*-slope0.25*/seed0/run.h5")
    assert read_run(path).config["slope"] == 0.25


def test_class_inc_config_keys_of_the_activation(slope_activation) -> None:
    cmd = CLASSINC["class-inc"]
    assert cmd.make_config({"act": "test_slope", "slope": 2, "width": 8})["slope"] == 2.0
    with pytest.raises(ConfigError, match="slope must be a number"):
        cmd.make_config({"act": "test_slope", "slope": "steep", "width": 8})
    with pytest.raises(ConfigError, match="slope would be ignored"):
        cmd.make_config({"act": "relu", "slope": 0.5, "width": 8})
