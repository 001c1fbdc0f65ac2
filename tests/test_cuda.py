"""The CUDA paths against their CPU twins, where a GPU is (skipped elsewhere): the device step, eager and compiled,
on the GPU equals the eager one on the CPU in float64 (its draws are counters, the same on every device); an Atari
DQN population on the GPU (loop and vmap) equals the CPU's loop in float64; Rainbow's stacked form equals its loop on
the GPU in float64 (on a GPU the members' noise comes from CUDA generators, so the CPU's draws are not the twin);
an Atari population with its frames on the GPU equals one with them on the host, bit for bit."""

from __future__ import annotations

import pytest
import torch
from test_population_atari import MEMBERS as ATARI_MEMBERS
from test_population_atari import RAINBOW, SETTINGS
from test_population_device import MEMBERS, _config

from agents.population.atari import AtariPopulation
from agents.population.device import DevicePopulation
from agents.population.engine import Member
from agents.population.networks import member_q_net
from agents.population.run import member_configs
from agents.rl.config import resolve

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _close(got: dict, want: dict, atol: float, what: str) -> None:
    assert got.keys() == want.keys()
    for name, w in want.items():
        g = got[name].cpu()
        assert torch.allclose(g, w.cpu(), atol=atol, rtol=0), (what, name, (g - w.cpu()).abs().max())


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_the_device_step_on_the_gpu_is_the_cpu_one_in_float64(compile):
    config = _config("elephant")

    def population(device: str, compiled: bool) -> DevicePopulation:
        return DevicePopulation(config, MEMBERS, nets=[member_q_net(config, m.seed).double() for m in MEMBERS],
                                readback=64, device=device, compile=compiled)

    cpu, gpu = population("cpu", False), population("cuda", compile)
    cpu.learn(400)
    gpu.learn(400)
    for m in range(3):
        _close(gpu.member_state(m), cpu.member_state(m), 1e-7, f"member {m}")
    assert gpu.episodes == cpu.episodes and sum(map(len, cpu.episodes)) > 0
    assert gpu.diverged.tolist() == cpu.diverged.tolist()


def _atari(config: dict, members: list[Member], implementation: str, device: str) -> AtariPopulation:
    return AtariPopulation(config, members, nets=[member_q_net(config, m.seed).double() for m in members],
                           implementation=implementation, device=device)


@pytest.mark.parametrize("implementation", ["loop", "vmap"])
def test_an_atari_population_on_the_gpu_is_the_cpu_loop_in_float64(implementation):
    members = [*ATARI_MEMBERS, Member(seed=2, learning_rate=1e-3, buffer_size=64)]
    config = member_configs({**SETTINGS, "act": "elephant"}, members)[0]
    cpu, gpu = _atari(config, members, "loop", "cpu"), _atari(config, members, implementation, "cuda")
    for steps, atol in ((40, 1e-10), (160, 1e-7)):
        cpu.learn(steps)
        gpu.learn(steps)
        for m in range(len(members)):
            _close(gpu.member_state(m), cpu.member_state(m), atol, f"member {m} at {cpu.num_timesteps}")
    assert gpu.episodes == cpu.episodes


def test_the_stacked_rainbow_on_the_gpu_is_its_loop_in_float64(monkeypatch):
    import stable_baselines3.common.policies as sb3_policies

    monkeypatch.setattr(sb3_policies, "preprocess_obs", lambda obs, space, normalize_images=True: obs.double())
    config = resolve("rainbow", {**RAINBOW, "act": "elephant", "device": "cuda"})
    members = [*ATARI_MEMBERS, Member(seed=2, learning_rate=1e-3, buffer_size=64)]
    pops = {impl: AtariPopulation(config, members, implementation=impl, dtype=torch.float64, device="cuda")
            for impl in ("vmap", "loop")}
    for steps, atol in ((40, 1e-10), (160, 1e-6)):  # (as on the CPU: tests/test_population_atari.py)
        for pop in pops.values():
            pop.learn(steps)
        for m in range(len(members)):
            _close(pops["vmap"].member_state(m), pops["loop"].member_state(m), atol,
                   f"member {m} at {pops['loop'].num_timesteps}")
    assert pops["vmap"].episodes == pops["loop"].episodes


@pytest.mark.parametrize("implementation", ["loop", "vmap"])
def test_frames_on_the_gpu_train_what_frames_on_the_host_train(implementation):
    """``frames_on: device`` on the GPU (the frames there, samples gathered there) against the host's frames on the
    same GPU: the same members, bit for bit."""
    pops = []
    for where in ("host", "device"):
        config = member_configs({**SETTINGS, "act": "elephant", "frames_on": where, "device": "cuda"},
                                ATARI_MEMBERS)[0]
        pop = AtariPopulation(config, ATARI_MEMBERS, implementation=implementation, device="cuda")
        pop.learn(200)
        assert isinstance(pop.replay[0].frames, torch.Tensor) == (where == "device")
        pops.append(pop)
    for m in range(len(ATARI_MEMBERS)):
        a, b = pops[0].member_state(m), pops[1].member_state(m)
        assert all(torch.equal(a[k], b[k]) for k in a), m
    assert pops[0].episodes == pops[1].episodes
