"""A registered activation's own arguments are flags and config keys of ``stream-sin``, ``edit`` and ``class-inc``."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch
import yaml
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


@pytest.mark.parametrize("name", ["stream-sin", "edit", "class-inc"])
def test_config_keys_of_the_activation(slope_activation, name, tmp_path) -> None:
    """The same rules in every learner: an activation's argument is a key of its own, typed by its spec; one the
    chosen activation does not take is refused, a setting of its own (d) only where changed from its default."""
    cmd = {**STREAM, **CLASSINC}[name]
    assert cmd.make_config({"act": "test_slope", "slope": 2, "width": 8})["slope"] == 2.0  # a YAML int: a float
    with pytest.raises(ConfigError, match="slope must be a number"):
        cmd.make_config({"act": "test_slope", "slope": "steep", "width": 8})
    with pytest.raises(ConfigError, match="'relu' does not take slope"):
        cmd.make_config({"act": "relu", "slope": 0.5, "width": 8})
    elephant = cmd.make_config({"act": "elephant", "d": 5, "width": 8})
    assert elephant["d"] == 5 and "slope" not in elephant
    with pytest.raises(ConfigError, match=r"d would be ignored here \(relu takes no arguments\)"):
        cmd.make_config({"act": "relu", "d": 5, "width": 8})
    relu = cmd.make_config({"act": "relu", "width": 8})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(relu))  # a run's config.yaml, as --config FILE
    assert cmd.make_config({"config": tmp_path / "config.yaml"}) == relu
    assert cmd.make_config({"config": tmp_path / "config.yaml", "width": 16}) == {**relu, "width": 16}


def test_class_inc_takes_the_activations_own_flag(slope_activation, tmp_path: Path, capsys) -> None:
    summary = _main(capsys, "class-inc", "--act", "test_slope", "--slope", "0.25", "--width", "16", "--probe", "",
                    "--out", str(tmp_path))
    assert summary["status"] == "finished"
    assert BUILT and set(BUILT) == {0.25}
    (path,) = tmp_path.glob("class-inc/split-digits/mlp-test_slope/w16-bs10/*-slope0.25*/seed0/run.h5")
    assert read_run(path).config["slope"] == 0.25


def test_dqn_and_its_population_take_the_activations_own_flag(slope_activation, tmp_path: Path, capsys) -> None:
    """One run, and two seeds as one population (their nets built by the same policy, so with the same argument)."""
    flags = ["--act", "test_slope", "--slope", "0.25", "--steps", "200", "--set", "learning_starts=100",
             "--set", "hidden=[16]", "--no-progress", "--out", str(tmp_path)]
    assert _main(capsys, "dqn", "--env", "CartPole-v1", *flags)["status"] == "finished"
    assert main(["dqn", "--env", "Acrobot-v1", "--seeds", "0-1", *flags]) == 0
    assert "2 runs as one population" in capsys.readouterr().err
    logs = sorted(tmp_path.rglob("run.h5"))
    assert len(logs) == 3 and all(read_run(p).config["act_kwargs"] == {"slope": 0.25} for p in logs)
    member = next(p for p in logs if "Acrobot" in str(p))
    assert read_run(member).attrs["engine"].startswith("population:")
    from agents.population.networks import member_q_net

    net = member_q_net(yaml.safe_load((member.parent / "config.yaml").read_text()), 0)  # as the engine builds it
    assert [m.slope for m in net.modules() if isinstance(m, Slope)] == [0.25]
