"""Population members against SB3's DQN (``agents.train dqn``'s model), in lockstep: with the same initial weights
(built the same way), env seeds, exploration draws and replay indices (recorded from the SB3 run and injected), each
member's weights after 1000 updates equal SB3's, bit for bit; a member equals a population of one; the batched
network equals the per-member loop in float64."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from agents.population.engine import COMPILE_FROM, Draws, Member, Population, member_q_net
from agents.population.run import member_configs
from agents.rl.config import resolve
from agents.rl.run import build_model

STEPS = 2000  # learning_starts 1000, then one update per step: 1000 updates


def sb3_run(config: dict) -> tuple[dict, dict[str, torch.Tensor]]:
    """Train SB3's DQN for STEPS; its draws (exploration coins, random actions, replay indices) and final weights."""
    model = build_model(config)
    draws = {"coins": [], "actions": [], "indices": []}
    sample = model.action_space.sample

    def recorded_sample(*args, **kwargs):
        a = sample(*args, **kwargs)
        draws["actions"].append(int(a))
        return a

    model.action_space.sample = recorded_sample
    rand = np.random.rand

    def recorded_rand(*args):
        u = rand(*args)
        draws["coins"].append(float(u))
        return u

    get = model.replay_buffer._get_samples

    def recorded_get(batch_inds, env=None):
        draws["indices"].append(np.array(batch_inds))
        return get(batch_inds, env)

    model.replay_buffer._get_samples = recorded_get
    np.random.rand = recorded_rand
    try:
        model.learn(STEPS)
    finally:
        np.random.rand = rand
    return draws, {k: v.detach().clone() for k, v in model.q_net.state_dict().items()}


class Injected:
    """Per member, the draws an SB3 run made, in order."""

    def __init__(self, per_member: list[dict]) -> None:
        self.d = [{k: list(v) for k, v in d.items()} for d in per_member]

    def explore(self, m):
        return self.d[m]["coins"].pop(0)

    def action(self, m):
        return self.d[m]["actions"].pop(0)

    def all_indices(self, sizes, k):
        idx = np.stack([d["indices"].pop(0) for d in self.d])
        assert (idx.max(1) < sizes).all() and idx.shape[1] == k
        return idx


#: the second member has its own epsilon schedule (the first the config's)
MEMBERS = [Member(seed=0, learning_rate=1e-3, buffer_size=10_000),
           Member(seed=1, learning_rate=3e-4, buffer_size=300, exploration_initial_eps=0.6, exploration_final_eps=0.1,
                  exploration_steps=400)]


@pytest.fixture(scope="module", params=["elephant", "relu"])
def lockstep(request):
    """Two SB3 runs (seeds 0 and 1, learning rates 1e-3 and 3e-4, buffers 1e4 and 300, the second with epsilon
    0.6 -> 0.1 over 400 steps) and the population of both members ("loop": the kernels SB3 runs) with the SB3 runs'
    draws injected."""
    configs = member_configs({"env": "MountainCar-v0", "act": request.param, "n_timesteps": STEPS}, MEMBERS)
    assert configs[1]["exploration_final_eps"] == 0.1 and configs[0]["exploration_final_eps"] == 0.01
    runs = [sb3_run(c) for c in configs]
    pop = Population(configs[0], MEMBERS, draws=Injected([d for d, _ in runs]), implementation="loop")
    pop.learn(STEPS)
    return configs, runs, pop


def test_members_equal_sb3_dqn_after_1000_updates(lockstep):
    _, runs, pop = lockstep
    for m, (draws, weights) in enumerate(runs):
        assert len(draws["indices"]) == STEPS - 1000 and not any(d for d in pop.draws.d[m].values())  # all used
        state = pop.member_state(m)
        for name, w in weights.items():
            assert torch.equal(state[name], w), (m, name, (state[name] - w).abs().max())  # bit for bit


def test_a_member_equals_a_population_of_one(lockstep):
    configs, runs, pop = lockstep
    alone = Population(configs[1], [MEMBERS[1]], draws=Injected([runs[1][0]]), implementation="loop")
    alone.learn(STEPS)
    for name, w in alone.member_state(0).items():
        assert torch.equal(w, pop.member_state(1)[name]), name


@pytest.mark.parametrize("act,impl", [pytest.param(a, "compiled", marks=pytest.mark.compile)
                                      for a in ("elephant", "relu", "maxout", "lwta", "fta")]
                         + [(a, i) for a in ("elephant", "relu") for i in ("batched", "vmap")]
                         + [(a, "batched") for a in ("maxout", "lwta", "fta")])
def test_the_batched_network_is_the_loop_in_float64(act, impl):
    """The fast paths ("batched" matmuls with the fused Elephant kernel; "vmap") against their slow twin ("loop"), in
    float64 so that
    rounding cannot hide a wrong formula: 3 members, 300 updates, their own draws. (Learning rates that blow a
    network up, 1e-2 here, make Q-values tie to the last bits, and then the two paths may act differently.)"""
    members = [*MEMBERS, Member(seed=2, learning_rate=3e-3, buffer_size=32)]
    config = resolve("dqn", {"env": "MountainCar-v0", "act": act, "n_timesteps": 1300})
    pops = {}
    for which in (impl, "loop"):
        nets = [member_q_net(config, m.seed).double() for m in members]
        pops[which] = Population(config, members, nets=nets, implementation=which)
        assert pops[which].implementation == which
        pops[which].learn(1300)
    for m in range(len(members)):
        fast, slow = pops[impl].member_state(m), pops["loop"].member_state(m)
        for name in slow:
            assert torch.allclose(fast[name], slow[name], atol=1e-9, rtol=0), (m, name)
    assert pops[impl].episodes == pops["loop"].episodes


def test_each_members_draws_come_from_its_own_generator_and_stay_in_range():
    """Draws' replay indices and actions (``floor(u * n)`` of one uniform per call): row ``m`` is what member ``m``'s
    generator alone gives (another member set leaves it unchanged), in ``[0, size)`` down to size 1, and uniform."""
    sizes = np.array([1, 2, 3, 10_000])
    draws = Draws([5, 6, 7, 8], n_actions=3)
    idx = np.concatenate([draws.all_indices(sizes, 32) for _ in range(300)], axis=1)
    assert idx.dtype == np.int64 and (idx >= 0).all() and (idx < sizes[:, None]).all()
    assert (idx[0] == 0).all() and set(idx[2]) == {0, 1, 2}
    counts = np.bincount(idx[2], minlength=3) / idx.shape[1]
    assert np.abs(counts - 1 / 3).max() < 0.02  # 9,600 draws: 5 standard deviations
    alone = Draws([7], n_actions=3)
    assert np.array_equal(np.concatenate([alone.all_indices(sizes[2:3], 32) for _ in range(300)], axis=1)[0], idx[2])
    actions = [draws.action(0) for _ in range(3000)]
    assert set(actions) == {0, 1, 2} and abs(actions.count(0) / 3000 - 1 / 3) < 0.05


def test_bad_settings_are_refused():
    config = resolve("dqn", {"env": "MountainCar-v0", "td_loss": "huber"})
    with pytest.raises(ValueError, match="the population engine runs the paper's DQN"):
        Population(config, MEMBERS)
    tanh = resolve("dqn", {"env": "MountainCar-v0", "act": "tanh"})
    with pytest.raises(ValueError, match="implementation='batched' runs MLPs of Linear, LayerNorm, ReLU, Elephant, "
                                         "Maxout, LWTA and FTA layers"):
        Population(tanh, MEMBERS[:1], implementation="batched")
    assert Population(tanh, MEMBERS[:1]).implementation == "vmap"  # auto: the generic path
    with pytest.raises(ValueError, match="implementation must be one of"):
        Population(resolve("dqn", {"env": "MountainCar-v0"}), MEMBERS, implementation="fast")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda': this torch build or machine has no CUDA"):
            Population(resolve("dqn", {"env": "MountainCar-v0"}), MEMBERS, device="cuda")
    with pytest.raises(ValueError, match=r"the batched envs run the registered envs' defaults; env_kwargs"):
        Population(resolve("dqn", {"env": "Catcher-PLE-v0", "env_kwargs": {"rect_rounding": "round"}}), MEMBERS)
    with pytest.raises(ValueError, match="no batched version of 'CartPole-v1'"):
        Population(resolve("dqn", {"env": "CartPole-v1"}), MEMBERS)


@pytest.mark.parametrize("group", ["maxout", "lwta"])
@pytest.mark.parametrize("inputs, layers", [
    (2, "20 G 3"),  # slab form
    (70, "20 G 3"),  # the module after a wide layer
    (2, "20 G 10 G 3"),  # chained slab layers
    (2, "20 G 10 relu 3"),  # a slab layer, then a Linear layer in plain order
    (2, "20 G 10 maxout 3"), (2, "20 G 10 lwta 3")])  # one group size after another
def test_the_compiled_forms_of_maxout_and_lwta_nets_are_their_modules_in_float64(group, inputs, layers):
    """The forward "compiled" compiles (here run eagerly), with the group max in slab form after a Linear of few
    inputs (:func:`agents.population.networks._slab_form`) and as the module after a wide one: outputs and
    gradients, through autograd (the population engine's "compiled") and through ``torch.func.grad`` (the device
    step's), equal each member's own network's; ties (two of a group's five units, and all five of another) split
    Maxout's gradient and pass LWTA's as the modules do. ``G`` is the layer under test (k = 5)."""
    from torch import nn
    from torch.func import stack_module_state

    from agents.population.engine import _batched_forward
    from interference import LWTA, Maxout

    torch.manual_seed(0)
    modules = {"maxout": lambda: Maxout(5), "lwta": lambda: LWTA(5), "relu": nn.ReLU}

    def net() -> nn.Sequential:
        built, width = [], inputs
        for token in layers.replace("G", group).split():
            if token.isdigit():
                built.append(nn.Linear(width, int(token)))
                width = int(token)
            else:
                built.append(modules[token]())
                width = width // 5 if token == "maxout" else width
        return nn.Sequential(*built).double()

    nets = [net() for _ in range(3)]
    with torch.no_grad():  # units 0 and 1 tie as their group's winners; units 5-9 tie throughout
        for n in nets:
            n[0].weight[1], n[0].bias[:2] = n[0].weight[0], 10.0
            n[0].weight[6:10], n[0].bias[6:10] = n[0].weight[5], n[0].bias[5]
    stacked = stack_module_state(nets)[0]
    params = {k: v.detach().requires_grad_(True) for k, v in stacked.items()}
    x = torch.randn(3, 8, inputs, dtype=torch.float64)
    fast = _batched_forward(nets[0], compiled=True)
    slow = torch.stack([n(x[m]) for m, n in enumerate(nets)])
    torch.testing.assert_close(fast(params, x), slow, rtol=0, atol=1e-12)
    fast(params, x).square().sum().backward()
    slow.square().sum().backward()
    expected = {name: torch.stack([dict(n.named_parameters())[name].grad for n in nets]) for name in params}
    for name, p in params.items():
        torch.testing.assert_close(p.grad, expected[name], rtol=0, atol=1e-12, msg=name)
    functional = torch.func.grad(lambda p: fast(p, x).square().sum())(dict(stacked))
    for name, g in functional.items():
        torch.testing.assert_close(g, expected[name], rtol=0, atol=1e-12, msg=f"torch.func: {name}")


def test_auto_picks_the_measured_faster_path():
    """From COMPILE_FROM agent-steps "auto" compiles, except networks with an LWTA layer out of slab form (eager is
    faster there: here after a Linear layer of 100 inputs)."""
    big = {"env": "MountainCar-v0", "n_timesteps": COMPILE_FROM}
    for act in ("elephant", "fta", "maxout", "lwta"):
        assert Population(resolve("dqn", {**big, "act": act}), MEMBERS[:1]).implementation == "compiled", act
    deep = resolve("dqn", {**big, "act": "lwta", "net_arch": [100, 100], "match_width": False})
    assert Population(deep, MEMBERS[:1]).implementation == "batched"
    small = resolve("dqn", {"env": "MountainCar-v0", "n_timesteps": 100})
    assert Population(small, MEMBERS[:1]).implementation == "batched"


def test_a_failed_compile_falls_back_to_batched_on_the_same_replay_sample():
    """Under "auto", a compile that fails at the first update warns and trains "batched" from there, on the sample
    already drawn for that update: the result is a "batched" run's, bit for bit (the failed try costs no draw)."""
    config = resolve("dqn", {"env": "MountainCar-v0", "act": "relu", "n_timesteps": COMPILE_FROM,
                             "set": ["learning_starts=20", "hidden=[8]", "match_width=false"]})
    failing, batched = (Population(config, MEMBERS[:2], implementation=i) for i in ("auto", "batched"))
    assert failing.implementation == "compiled"

    def no_compiler(*args):
        raise RuntimeError("no C++ compiler")

    failing._losses = no_compiler
    with pytest.warns(UserWarning, match=r"torch.compile failed \(RuntimeError\); the population runs 'batched'"):
        failing.learn(30)
    batched.learn(30)
    assert failing.implementation == "batched"
    assert all(torch.equal(failing.params[k], batched.params[k]) for k in batched.params)
    assert [r.bit_generator.state for r in failing.draws.rngs] == [r.bit_generator.state for r in batched.draws.rngs]


def test_a_members_probe_context_is_its_network_and_replay():
    """What a probe sees of member m: its weights, rows of its own buffer drawn with the probe's RNG, TD targets from
    its target network (recomputed here member by member), the per-sample squared TD error."""
    config = resolve("dqn", {"env": "MountainCar-v0", "act": "elephant", "n_timesteps": 1300,
                             "target_update_interval": 250})
    pop = Population(config, MEMBERS, implementation="loop")
    pop.learn(1300)  # the target copy (step 1250) lags the network
    for m, member in enumerate(MEMBERS):
        model = member_q_net(config, member.seed)
        ctx = pop.member_probe_context(m, model, np.random.default_rng(5))
        assert all(torch.equal(v, pop.member_state(m)[k]) for k, v in model.state_dict().items())
        obs, act, y = ctx["sample"](16)
        idx = np.random.default_rng(5).integers(0, int(pop.size[m]), 16)
        assert torch.equal(obs, torch.as_tensor(pop.obs_buf[m, idx])) and np.array_equal(act, pop.act_buf[m, idx])
        target = member_q_net(config, member.seed)
        target.load_state_dict({f"q_net.{k}": v[m] for k, v in pop.target.items()})
        with torch.no_grad():
            next_q = target(torch.as_tensor(pop.next_buf[m, idx])).max(1).values
        expected = torch.as_tensor(pop.rew_buf[m, idx]) + (1 - torch.as_tensor(pop.done_buf[m, idx])) * 0.99 * next_q
        assert torch.allclose(y, expected, atol=1e-6, rtol=0)
        td = ctx["losses"]["td"](model, (obs, act, y))
        with torch.no_grad():
            q = model(obs).gather(1, act[:, None]).squeeze(1)
        assert td.shape == (16,) and torch.allclose(td, (q - y) ** 2)


def test_a_population_writes_the_run_folders_of_single_runs(tmp_path):
    """Members' folders, configs and logs are those ``agents.train dqn`` writes, so reports read them unchanged."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from agents.commands import get_command
    from agents.population.run import member_configs
    from runlog import read_run
    from reports.data import finished

    root = Path(__file__).resolve().parents[1]
    settings = ["max_episode_steps=200", "hidden=[64]", "probe=[gradcov,sparsity]", "probe_every=500"]
    grid = tmp_path / "grid.yml"  # (a population of 2 seeds x 2 buffer sizes)
    grid.write_text("command: dqn\nengine: population\nfixed: {env: MountainCar-v0, act: relu, lr: 0.001, steps: 1500, "
                    f"progress: false, set: {json.dumps(settings)}}}\ngrids: [{{seed: [0, 1], buffer_size: [32, 10000]}}]\n")
    proc = subprocess.run([sys.executable, "-m", "agents.grid", str(grid), "--out", str(tmp_path), "--workers", "1"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    single = subprocess.run([sys.executable, "-m", "agents.train", "dqn", "--env", "MountainCar-v0", "--act", "relu",
                             "--steps", "1500", *(a for x in settings for a in ("--set", x)), "--out",
                             str(tmp_path / "single")], cwd=root, capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr
    members = [Member(s, 1e-3, b) for s in (0, 1) for b in (32, 10_000)]
    configs = member_configs({"env": "MountainCar-v0", "act": "relu", "n_timesteps": 1500, "set": settings}, members)
    alone = read_run(next((tmp_path / "single").rglob("run.h5")))
    layout = lambda r: {g: {f: np.shape(v) for f, v in d.items()} for g, d in r.probes.items()}  # noqa: E731
    for c in configs:
        run_dir = get_command("dqn").run_dir(c, tmp_path)
        run = read_run(run_dir / "run.h5")
        assert finished(run) and run.config["buffer_size"] == c["buffer_size"] and run.seed == c["seed"]
        assert layout(run) == layout(alone) and set(run.scalars) == set(alone.scalars)  # probes as a single run's
        assert set(run.attrs) - set(alone.attrs) <= {"engine", "population_size"}
        steps, returns = run.scalars["episode_return"]
        assert len(steps) == 7 and np.all(returns == -200.0)  # 1500 steps of 200-step episodes, none reached the top
        assert np.array_equal(run.scalars["loss"][0], alone.scalars["loss"][0])  # the updates a single run logs
        assert np.array_equal(run.scalars["learning_rate"][0], alone.scalars["learning_rate"][0])
        assert np.all(run.scalars["learning_rate"][1] == 1e-3)
        assert json.loads((run_dir / "summary.json").read_text())["episodes"] == 7
    report = subprocess.run([sys.executable, "-m", "reports", str(tmp_path), "-o", str(tmp_path / "report")],
                            cwd=root, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr


@pytest.mark.long  # five processes: .ci/run's step of long tests
def test_a_killed_population_resumes_to_the_uninterrupted_result(tmp_path):
    """A population of 64 seeds (``agents.train dqn --seeds 0-63``): SIGKILL right after the second checkpoint, or SIGTERM (a
    checkpoint of the step it stops after), then --resume: every member's log, probes and final weights equal those
    of an uninterrupted population (a kill loses at most one checkpoint interval of work, nothing of the result)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from runlog import read_run
    from runlog.failpoints import ENV as KILL_AT

    root = Path(__file__).resolve().parents[1]
    args = [sys.executable, "-m", "agents.train", "dqn", "--env", "Acrobot-v1", "--act", "elephant", "--seeds",
            "0-63", "--steps", "600", "--set", "max_episode_steps=150", "--set", "learning_starts=200", "--set",
            "hidden=[64]", "--set", "probe=[gradcov]", "--set", "probe_every=300", "--checkpoint-every", "200",
            "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != KILL_AT}
    ref = subprocess.run([*args, "--out", str(tmp_path / "ref")], cwd=root, env=env, capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr
    killed = subprocess.run([*args, "--out", str(tmp_path / "run")], cwd=root, capture_output=True, text=True,
                            env={**env, KILL_AT: "checkpoint.after_rename:2"})
    assert killed.returncode == -signal.SIGKILL
    resumed = subprocess.run([*args, "--resume", "--out", str(tmp_path / "run")], cwd=root, env=env,
                             capture_output=True, text=True)
    assert resumed.returncode == 0 and "resuming the population of 64 at step 400" in resumed.stderr, resumed.stderr
    # SIGTERM once the first checkpoint exists: a checkpoint of the step it stopped after, exit 143, resumed
    term = subprocess.Popen([*args, "--out", str(tmp_path / "term")], cwd=root, env=env, stderr=subprocess.PIPE,
                            text=True)
    while not list((tmp_path / "term" / "populations").glob("*.pkl")) and term.poll() is None:
        time.sleep(0.05)
    term.send_signal(signal.SIGTERM)
    assert term.wait(timeout=120) == 128 + signal.SIGTERM
    assert "stopped by signal 15 at step" in term.stderr.read()
    again = subprocess.run([*args, "--resume", "--out", str(tmp_path / "term")], cwd=root, env=env,
                           capture_output=True, text=True)
    assert again.returncode == 0 and "resuming the population of 64 at step" in again.stderr, again.stderr
    logs = sorted((tmp_path / "ref").rglob("run.h5"))
    assert len(logs) == 64
    for a, b in ((a, tmp_path / out / a.relative_to(tmp_path / "ref")) for a in logs for out in ("run", "term")):
        ra, rb = read_run(a), read_run(b)
        for name in ra.scalars:
            assert all(np.array_equal(x, y) for x, y in zip(ra.scalars[name], rb.scalars[name])), name
        assert len(ra.probes["gradcov"]["step"]) == 2  # at 300 and 600; the kill was at 400
        for group, fields in ra.probes.items():
            for f, v in fields.items():
                assert np.array_equal(v, rb.probes[group][f]), (group, f)
        wa, wb = torch.load(a.parent / "q_net.pt"), torch.load(b.parent / "q_net.pt")
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    for out in ("run", "term"):
        assert not list((tmp_path / out / "populations").glob("*.pkl"))  # finished: the checkpoint is gone


def test_a_diverging_member_ends_as_a_diverged_run_and_the_others_go_on(tmp_path, monkeypatch):
    """A member whose TD loss turns non-finite stops there (run_end "nan", summary status "nan"), as a single run
    does; the other members train exactly as a population without it (members interact nowhere). FTA's network here,
    whose non-persistent buffer stays out of q_net.pt (a strict load into the member's QNetwork works); a stale
    checkpoint from an earlier population at the same path is not resumed by a fresh start; a population whose
    members all diverged stops."""
    from agents.commands import get_command
    from agents.errors import ConfigError
    from agents.population.run import _checkpoint_path, member_configs, run_population
    from runlog import read_run

    values = {"env": "Acrobot-v1", "act": "fta", "n_timesteps": 600, "set": ["learning_starts=100"]}
    wild = Member(seed=0, learning_rate=1e30, buffer_size=64)  # its squared TD errors overflow float32
    members = [Member(seed=1, learning_rate=1e-3, buffer_size=300), wild]
    path = _checkpoint_path(tmp_path / "both", member_configs(values, members))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="the population checkpoint is unreadable .*; delete it to start"):
        run_population(values, members, tmp_path / "both", implementation="batched", resume=True)
    both = run_population(values, members, tmp_path / "both", implementation="batched")
    alone = run_population(values, members[:1], tmp_path / "alone", implementation="batched")
    assert not path.exists()
    assert both[1]["status"] == "nan" and both[1]["steps"] < 600 and both[0]["status"] == "finished"
    configs = member_configs(values, members)
    dirs = [get_command("dqn").run_dir(c, tmp_path / "both") for c in configs]
    assert read_run(dirs[1] / "run.h5").scalars["run_end"][0][-1] == both[1]["steps"]
    a = torch.load(dirs[0] / "q_net.pt")
    b = torch.load(get_command("dqn").run_dir(configs[0], tmp_path / "alone") / "q_net.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    member_q_net(configs[0], 1).load_state_dict(a)  # strict: exactly the QNetwork's keys
    step, steps = Population.step, []

    def counted(pop, *args, **kwargs):
        steps.append(pop.num_timesteps)
        return step(pop, *args, **kwargs)

    monkeypatch.setattr(Population, "step", counted)  # a population whose members all ended stops there
    [lone] = run_population(values, [wild], tmp_path / "wild", implementation="batched")
    assert lone == {**both[1], **{k: lone[k] for k in lone if "second" in k or k == "run_dir"}}
    assert len(steps) == lone["steps"] < 600


def test_a_population_stays_resumable_until_its_results_are_written_and_finishes_once(tmp_path, monkeypatch, capsys):
    """A fresh start clears a single run's leftovers from the member folders; a failure while the results are written
    leaves the checkpoint, so --resume finishes the population; --resume on a finished one returns its summaries and
    rewrites nothing. A member's q_net.pt holds its own tensors, not the population's whole storage."""
    import json

    from agents.commands import get_command
    from agents.population.run import _checkpoint_path, member_configs, run_population

    values = {"env": "Acrobot-v1", "act": "relu", "n_timesteps": 400,
              "set": ["learning_starts=100", "hidden=[16]", "match_width=false"]}
    members = [Member(seed=s, learning_rate=1e-3, buffer_size=300) for s in range(3)]
    configs = member_configs(values, members)
    dirs = [get_command("dqn").run_dir(c, tmp_path) for c in configs]
    path = _checkpoint_path(tmp_path, configs)
    dirs[2].mkdir(parents=True)
    for name in ("model.zip", "checkpoint.pkl", "summary.json"):  # a single run's files from before
        (dirs[2] / name).write_text(json.dumps({"status": "finished"}))
    save, calls = torch.save, []

    def full_disk_at_the_second_member(obj, f, *args, **kwargs):
        calls.extend([f] if "q_net.pt" in str(getattr(f, "name", f)) else [])  # (written into a temporary file)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk_at_the_second_member)
    with pytest.raises(OSError, match="No space left"):
        run_population(values, members, tmp_path, implementation="batched", checkpoint_every=100)
    monkeypatch.setattr(torch, "save", save)
    assert path.exists() and not any((dirs[2] / n).exists() for n in ("model.zip", "checkpoint.pkl", "summary.json"))
    done = run_population(values, members, tmp_path, implementation="batched", resume=True)
    assert "resuming the population of 3 at step 300" in capsys.readouterr().err
    assert not path.exists() and [s["status"] for s in done] == ["finished"] * 3
    stamps = {f: f.stat().st_mtime_ns for d in dirs for f in d.iterdir() if f.name != ".lock"}  # (the lock's holder)
    assert run_population(values, members, tmp_path, implementation="batched", resume=True) == done
    assert "the population of 3 finished already (400 steps); nothing to resume" in capsys.readouterr().err
    assert {f: f.stat().st_mtime_ns for d in dirs for f in d.iterdir() if f.name != ".lock"} == stamps
    weights = torch.load(dirs[0] / "q_net.pt")
    assert (dirs[0] / "q_net.pt").stat().st_size < 2 * sum(4 * w.numel() for w in weights.values()) + 4096


def test_a_checkpoint_older_than_a_fresh_start_in_a_member_folder_is_not_resumed(tmp_path, capsys,
                                                                                  full_disk_at_results):
    """Population (0, 1) stops with a checkpoint; population (2, 0) then starts afresh in seed 0's folder (a grid
    re-chunked and run without --resume). Resuming (0, 1) must not continue the old checkpoint over seed 0's new log:
    it is stale, removed, and (0, 1) start at step 0."""
    from agents.population.run import _checkpoint_path, member_configs, run_population

    values = {"env": "Acrobot-v1", "act": "relu", "n_timesteps": 300,
              "set": ["learning_starts=100", "hidden=[16]", "match_width=false"]}
    first = [Member(seed=s, learning_rate=1e-3, buffer_size=300) for s in (0, 1)]
    path = _checkpoint_path(tmp_path, member_configs(values, first))
    with pytest.raises(OSError, match="No space left"):
        run_population(values, first, tmp_path, implementation="batched", checkpoint_every=100)
    full_disk_at_results()  # (space freed)
    assert path.exists()
    run_population(values, [Member(2, 1e-3, 300), first[0]], tmp_path, implementation="batched")
    capsys.readouterr()
    done = run_population(values, first, tmp_path, implementation="batched", resume=True)
    err = capsys.readouterr().err
    assert "the checkpoint is stale and removed, the population of 2 starts at step 0" in err, err
    assert "resuming" not in err and [s["status"] for s in done] == ["finished"] * 2 and not path.exists()


def test_a_study_copied_without_its_file_times_resumes_its_checkpoints(tmp_path, capsys, full_disk_at_results):
    """Staleness is decided by the members' log ids recorded beside the checkpoint, not by file times: after a copy
    that gives every file a new time (``cp -r``, ``scp -r``; here every ``config.yaml`` made newer than the
    checkpoint), the population resumes; in the original, a fresh start in a member folder still makes its checkpoint
    stale though the checkpoint is dated after it."""
    import os
    import shutil
    import time

    from agents.population.run import _checkpoint_path, member_configs, run_population

    values = {"env": "Acrobot-v1", "act": "relu", "n_timesteps": 300,
              "set": ["learning_starts=100", "hidden=[16]", "match_width=false"]}
    members = [Member(seed=s, learning_rate=1e-3, buffer_size=300) for s in (0, 1)]
    with pytest.raises(OSError, match="No space left"):
        run_population(values, members, tmp_path / "here", implementation="batched", checkpoint_every=100)
    full_disk_at_results()
    shutil.copytree(tmp_path / "here", tmp_path / "there", copy_function=shutil.copy)  # (contents, not times)
    path = _checkpoint_path(tmp_path / "there", member_configs(values, members))
    later = time.time() + 60
    for config in (tmp_path / "there").rglob("config.yaml"):
        os.utime(config, (later, later))
    capsys.readouterr()
    done = run_population(values, members, tmp_path / "there", implementation="batched", resume=True)
    err = capsys.readouterr().err
    assert "resuming the population of 2 at step 200" in err and "stale" not in err, err
    assert [s["status"] for s in done] == ["finished"] * 2

    # the original's checkpoint, after a fresh start in seed 1's folder, dated after it: stale all the same
    run_population(values, [Member(2, 1e-3, 300), members[1]], tmp_path / "here", implementation="batched")
    path = _checkpoint_path(tmp_path / "here", member_configs(values, members))
    os.utime(path, (later, later))
    capsys.readouterr()
    run_population(values, members, tmp_path / "here", implementation="batched", resume=True)
    assert "the checkpoint is stale and removed" in capsys.readouterr().err


def test_a_fresh_start_killed_before_a_members_log_leaves_that_folder_as_it_was(tmp_path, monkeypatch,
                                                                                  full_disk_at_results):
    """A population's fresh start writes a member's config.yaml only after its log: killed in between (here at
    seed 1's log), seed 1's folder keeps the checkpointed population's log and config, which then resumes there;
    the logs opened before the kill are closed."""
    from agents.population import run
    from runlog import RunLog

    values = {"env": "Acrobot-v1", "act": "relu", "n_timesteps": 300,
              "set": ["learning_starts=100", "hidden=[16]", "match_width=false"]}
    members = [Member(seed=s, learning_rate=1e-3, buffer_size=300) for s in (0, 1)]
    with pytest.raises(OSError, match="No space left"):
        run.run_population(values, members, tmp_path, implementation="batched", checkpoint_every=100)
    full_disk_at_results()
    seed1 = run.member_dirs(run.member_configs(values, members), tmp_path)[1]
    before = {name: (seed1 / name).read_bytes() for name in ("config.yaml", "run.h5")}
    probed = {**values, "set": [*values["set"], "probe=[sparsity]"]}  # another population (other probes) ...
    real = run.MemberLog

    def killed_at_seed_1(pop, m, config, *args, **kwargs):
        if config["seed"] == 1:
            raise KeyboardInterrupt  # (a kill)
        return real(pop, m, config, *args, **kwargs)

    monkeypatch.setattr(run, "MemberLog", killed_at_seed_1)
    with pytest.raises(KeyboardInterrupt):  # ... started afresh in seeds 2 and 1, killed at seed 1's log
        run.run_population(probed, [Member(2, 1e-3, 300), members[1]], tmp_path, implementation="batched")
    monkeypatch.setattr(run, "MemberLog", real)
    assert {name: (seed1 / name).read_bytes() for name in ("config.yaml", "run.h5")} == before
    seed2 = run.member_dirs(run.member_configs(probed, [Member(2, 1e-3, 300)]), tmp_path)[0]
    RunLog(seed2 / "run.h5", config={}, seed=2, probes={}).close()  # (seed 2's log was closed, not left open)
    done = run.run_population(values, members, tmp_path, implementation="batched", resume=True)
    assert [s["status"] for s in done] == ["finished"] * 2


def test_a_members_list_without_log_ids_falls_back_to_file_times(tmp_path):
    """Checkpoints listed before log ids (2026-11-24) stay resumable: stale only where a member's config.yaml is
    newer than the checkpoint. A list with ids ignores times; a member whose log is gone or has another id makes it
    stale, and so does one whose log is unreadable (a fresh start killed while creating it, or corrupt, checked
    without hanging); where a member's recorded id is null (a log from before ids), that member's times decide."""
    import os
    import time

    from _runlog_writer import left_open_with_a_bad_header
    from agents.population import record_members, restarted_since
    from runlog import RunLog

    checkpoint, dirs = tmp_path / "populations" / "k.pkl", [tmp_path / "dqn" / f"seed{s}" for s in (0, 1)]
    checkpoint.parent.mkdir()
    checkpoint.write_bytes(b"")
    ids = []
    for d in dirs:
        with RunLog(d / "run.h5", config={}, seed=0, probes={}) as log:
            ids.append(log.log_id)
        (d / "config.yaml").write_text("{}")
    old, new = time.time() - 60, time.time() + 60
    os.utime(checkpoint, (old, old))
    record_members(checkpoint, dirs, tmp_path)  # (the old format: folders only)
    assert restarted_since(checkpoint, dirs) == dirs[0]
    for d in dirs:
        os.utime(d / "config.yaml", (old - 60, old - 60))
    assert restarted_since(checkpoint, dirs) is None
    os.utime(dirs[1] / "config.yaml", (new, new))
    record_members(checkpoint, dirs, tmp_path, ids)
    assert restarted_since(checkpoint, dirs) is None
    record_members(checkpoint, dirs, tmp_path, [ids[0], None])
    assert restarted_since(checkpoint, dirs) == dirs[1]
    record_members(checkpoint, dirs, tmp_path, ids)
    os.utime(dirs[1] / "config.yaml", (old - 60, old - 60))  # (the times alone would keep the checkpoint)
    good = (dirs[1] / "run.h5").read_bytes()
    corrupt = bytearray(good)
    corrupt[12] ^= 0xFF  # (a superblock byte: its checksum fails)
    (dirs[1] / "run.h5").write_bytes(bytes(corrupt))
    assert restarted_since(checkpoint, dirs) == dirs[1]  # a recorded log unreadable: no resume could use it
    left_open_with_a_bad_header(dirs[1] / "run.h5")  # (read only in SWMR mode, which retries it for minutes)
    assert restarted_since(checkpoint, dirs) == dirs[1]
    (dirs[1] / "run.h5").write_bytes(b"\x89HDF\r\n\x1a\n")  # a fresh start killed while creating its log
    assert restarted_since(checkpoint, dirs) == dirs[1]
    record_members(checkpoint, dirs, tmp_path, [ids[0], None])  # no id recorded for it: the times decide
    assert restarted_since(checkpoint, dirs) is None
    record_members(checkpoint, dirs, tmp_path, ids)
    (dirs[1] / "run.h5").unlink()
    assert restarted_since(checkpoint, dirs) == dirs[1]
    with RunLog(dirs[0] / "run.h5", config={}, seed=0, probes={}, overwrite=True):  # another run's log, same time
        pass
    os.utime(dirs[0] / "config.yaml", (old - 60, old - 60))
    assert restarted_since(checkpoint, dirs) == dirs[0]


@pytest.mark.parametrize("setting, expected", [([], [40, 80, 120, 160, 200, 240, 280, 320, 360]),
                                              (["checkpoint_every=150"], [150, 300]), (["checkpoint_every=0"], [])])
def test_a_population_checkpoints_at_its_configs_interval(tmp_path, monkeypatch, setting, expected):
    """The config's checkpoint_every (a grid's or --set's, as a single run's), by default a tenth of the run."""
    from agents.population import run

    steps = []
    monkeypatch.setattr(run, "_checkpoint", lambda path, pop, *args: steps.append(pop.num_timesteps))
    values = {"env": "Acrobot-v1", "act": "relu", "n_timesteps": 400,
              "set": ["learning_starts=100", "hidden=[16]", "match_width=false", *setting]}
    run.run_population(values, [Member(0, 1e-3, 300)], tmp_path, implementation="batched")
    assert steps == expected


def test_member_keys_are_the_members_fields():
    import dataclasses

    from agents.population import MEMBER_KEYS

    assert MEMBER_KEYS == tuple(f.name for f in dataclasses.fields(Member))


def test_each_member_follows_its_own_epsilon_schedule():
    """The members' epsilons against PaperDQN's schedule for each member's config (a schedule field left None is
    the config's), from the first step to past the longest decay, a decay of 0 steps included."""
    from agents.rl.run import build_model

    values = {"env": "MountainCar-v0", "act": "relu", "hidden": 8}
    members = [Member(0, 1e-3, 100), Member(1, 1e-3, 100, exploration_final_eps=0.2),
               Member(2, 1e-3, 100, exploration_initial_eps=0.5, exploration_steps=3000),
               Member(3, 1e-3, 100, exploration_steps=0)]
    configs = member_configs(values, members)
    pop = Population(configs[0], members)
    models = [build_model(c) for c in configs]
    for t in (0, 999, 1000, 1001, 1500, 2000, 2500, 4000, 10_000):
        assert pop.epsilon(t).tolist() == [m.epsilon(t) for m in models], t


def test_a_bad_epsilon_schedule_is_refused_naming_the_member():
    config = resolve("dqn", {"env": "MountainCar-v0"})
    for bad in ({"exploration_final_eps": 1.5}, {"exploration_initial_eps": -0.1}, {"exploration_steps": -5}):
        with pytest.raises(ValueError, match=r"member Member\(seed=1.*epsilons must lie in \[0, 1\] and "
                                             "exploration_steps be an integer >= 0"):
            Population(config, [MEMBERS[0], Member(1, 1e-3, 300, **bad)])


def test_a_checkpoint_from_before_per_member_schedules_resumes_with_the_configs():
    """A pickled population without the schedule arrays (checkpoints written before them) gets the config's."""
    import pickle

    config = resolve("dqn", {"env": "MountainCar-v0", "act": "relu", "hidden": 8})
    pop = Population(config, [Member(0, 1e-3, 100)])
    state = pop.__getstate__()
    for k in ("eps_initial", "eps_final", "eps_steps"):
        del state[k]
    old = Population.__new__(Population)
    old.__setstate__(pickle.loads(pickle.dumps(state)))
    assert old.epsilon(1500).tolist() == pop.epsilon(1500).tolist() == [pytest.approx(0.505)]


def test_settings_the_engine_would_ignore_are_refused():
    for setting in ({"lr_schedule": "linear"}, {"normalize_obs": True}, {"eval_every": 500},
                    {"optimizer_kwargs": {"alpha": 0.999, "eps": 1e-8, "momentum": 0.9}}):
        with pytest.raises(ValueError, match="the population engine runs the paper's DQN as agents.train dqn does"):
            Population(resolve("dqn", {"env": "MountainCar-v0", **setting}), MEMBERS)


def test_epsilon_schedules_sweep_into_run_folders_of_their_own(tmp_path):
    from agents.population.run import run_population

    values = {"env": "MountainCar-v0", "act": "relu", "n_timesteps": 120, "set": ["learning_starts=50", "net_arch=[8]"]}
    members = [Member(0, 1e-3, 300, exploration_final_eps=f, exploration_steps=100) for f in (0.01, 0.2)]
    assert [s["status"] for s in run_population(values, members, tmp_path)] == ["finished"] * 2
    finals = sorted(yaml.safe_load(p.read_text())["exploration_final_eps"] for p in tmp_path.rglob("config.yaml"))
    assert finals == [0.01, 0.2]


def test_the_benchmark_reports_rates_ratios_and_the_time_split(capsys):
    """A smoke run of ``agents.population.bench`` (2 sizes, 20 timed steps): its JSON has every size's rate, its
    ratio to SB3 (the mean of SB3 before and after) and the shares of acting, env and update."""
    from agents.population.bench import main

    assert main(["--act", "relu", "--sizes", "1,2", "--steps", "20", "--implementations", "batched", "--json"]) == 0
    out = capsys.readouterr()
    result = json.loads(out.out)
    base = result["sb3_steps_per_second"]
    assert base == pytest.approx(sum(result["sb3_before_after"]) / 2) and base > 0
    assert [(r["implementation"], r["P"]) for r in result["population"]] == [("batched", 1), ("batched", 2)]
    for r in result["population"]:
        assert r["ratio_to_sb3"] == pytest.approx(r["steps_per_second"] / base)
        assert set(r["time_share"]) == {"acting", "env", "update"} and 0 < sum(r["time_share"].values()) <= 1
    assert "x SB3" in out.err


def test_seeds_on_the_cli_train_as_one_population_where_the_engine_takes_them(tmp_path, capsys):
    """``agents.train dqn --seeds 0-2``: one population, each run in the folder ``--seed`` gives it, ended as a single
    run ends (summary, DONE.json); where the engine does not take the env the runs train one after another."""
    from agents.lifecycle import read_done
    from agents.train import main
    from runlog import read_run

    flags = ["--act", "relu", "--steps", "300", "--set", "learning_starts=100", "--set", "hidden=[16]",
             "--no-progress", "--out", str(tmp_path)]
    assert main(["dqn", "--env", "Acrobot-v1", "--seeds", "0-2", *flags]) == 0
    out = capsys.readouterr()
    assert "3 runs as one population" in out.err
    summaries = json.loads(out.out)
    assert [s["status"] for s in summaries] == ["finished"] * 3
    for seed, summary in enumerate(summaries):
        folder = tmp_path / "dqn" / "Acrobot-v1" / "relu"
        [run_dir] = [d for d in folder.rglob(f"seed{seed}") if d.is_dir()]
        assert summary["run_dir"] == str(run_dir) and read_done(run_dir)["summary"]["steps"] == summary["steps"] == 300
        assert read_run(run_dir / "run.h5").attrs["engine"].startswith("population:")
    assert main(["dqn", "--env", "CartPole-v1", "--seeds", "0,1", *flags]) == 0
    out = capsys.readouterr()
    assert "no batched version of 'CartPole-v1'" in out.err and "the 2 runs train one after another" in out.err
    assert len(json.loads(out.out)) == 2 and len(list((tmp_path / "dqn" / "CartPole-v1").rglob("DONE.json"))) == 2
    with pytest.raises(SystemExit, match="2"):
        main(["dqn", "--env", "Acrobot-v1", "--seeds", "0-1", "--seed", "3", *flags])
    assert "give --seed or --seeds, not both" in capsys.readouterr().err
