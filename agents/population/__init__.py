"""The population engine (issue 18): many value-based agents trained in lockstep in one process.

* :mod:`agents.population.envs`: classic-control tasks stepped as arrays, equal to the Gymnasium envs step for step.
"""
