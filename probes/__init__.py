"""Probes: diagnostics computed while a learner trains, logged to one crash-safe HDF5 file per run.

:mod:`runlog` (the run log: its own package, torch-free) <- ``probes.probe`` (the API) <- ``probes.builtin``
(gradcov, ntk, outputs, sparsity, weights, plasticity) <- ``probes.runner`` (plain training loops) and ``probes.sb3``
(Stable-Baselines3 callback). Import the SB3 adapter from ``probes.sb3``. ``runlog.schema`` declares what each
probe's fields mean (reports read it); ``probes.plugins`` loads users' plugin modules.
"""

from .builtin import (PROBES, GradCovProbe, NTKProbe, OutputsProbe, PlasticityProbe, SparsityProbe, WeightsProbe,
                      make_probe, register_probe)
from .probe import Probe, ProbeContext
from .runner import ProbeRunner

__all__ = [
    "PROBES", "GradCovProbe", "NTKProbe", "OutputsProbe", "PlasticityProbe", "Probe", "ProbeContext", "ProbeRunner",
    "SparsityProbe", "WeightsProbe", "make_probe", "register_probe",
]
