"""The population engine (issue 18): many value-based agents trained in lockstep in one process.

* :mod:`agents.population.envs`: classic-control tasks stepped as arrays, equal to the Gymnasium envs step for step;
* :mod:`agents.population.engine`: P paper-DQN members with stacked parameters, per-member learning rates, buffers
  and randomness; a member equals ``agents.train dqn``'s SB3 model bit for bit (``implementation="loop"``);
* :mod:`agents.population.run`: a population written as one run folder per member, as `agents.train dqn` writes;
* :mod:`agents.population.bench`: aggregate env steps/s against SB3's DQN, with the time split.
"""

#: what population members may differ in (dqn config keys; the fields of :class:`agents.population.engine.Member`, in
#: order); declared here so that the grid runner reads it without importing the engine
MEMBER_KEYS = ("seed", "learning_rate", "buffer_size")
