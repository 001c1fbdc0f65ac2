"""RL agents on Stable-Baselines3 with swappable activations.

* :mod:`agents.rl.policies`: SB3 policy classes (DQN, PPO, SAC) and a Nature-CNN features extractor built with
  :mod:`interference.nets`, for any registered activation;
* :mod:`agents.rl.dqn`: :class:`PaperDQN`, the paper's classic-control DQN (MSE TD loss, no clipping, absolute
  epsilon schedule); :mod:`agents.rl.rainbow`: our Rainbow;
* :mod:`agents.rl.frame_buffer`: the replay buffer that stores each stacked pixel frame once (Atari at 1e6);
* :mod:`agents.rl.evaluation`: greedy evaluation episodes during training; :mod:`agents.rl.budget`: a run's
  memory and duration before it starts;
* :mod:`agents.rl.config`: per-env YAML hyper-parameters (``agents/hyperparams/*.yml``), ``--config`` files and
  flags resolved into one validated config;
* :mod:`agents.rl.run`: builds the agent and trains it into a run directory with a probe log;
* :mod:`agents.rl.commands`: the ``dqn``, ``rainbow``, ``ppo`` and ``sac`` subcommands of ``python -m agents.train``;
* :mod:`agents.rl.bench`: env steps per second of two activations, measured in one process;
  :mod:`agents.rl.bench_replay`: the frame buffer's memory and speed against SB3's.

Submodules import SB3 and ALE; import them directly (``from agents.rl.policies import ActDQNPolicy``).
"""
