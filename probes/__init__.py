"""Probes: diagnostics computed while a learner trains, logged to one crash-safe HDF5 file per run.

``probes.runlog`` (file layout, writer, reader) <- ``probes.probe`` (the API) <- ``probes.builtin``
(gradcov, ntk, outputs, sparsity, weights, plasticity) <- ``probes.runner`` (plain training loops) and ``probes.sb3``
(Stable-Baselines3 callback). Import the SB3 adapter from ``probes.sb3``. ``probes.schema`` declares what each
probe's fields mean (reports read it); ``probes.plugins`` loads users' plugin modules.
"""

from .builtin import (PROBES, GradCovProbe, NTKProbe, OutputsProbe, PlasticityProbe, SparsityProbe, WeightsProbe,
                      make_probe, register_probe)
from .probe import Probe, ProbeContext
from .runlog import Field, Run, RunLog, RunLogError, RunLogWriteError, find_runs, read_run
from .runner import ProbeRunner
from .schema import FieldDoc, ProbeSchema

__all__ = [
    "PROBES", "Field", "FieldDoc", "GradCovProbe", "NTKProbe", "OutputsProbe", "PlasticityProbe", "Probe",
    "ProbeContext", "ProbeRunner", "ProbeSchema", "Run", "RunLog", "RunLogError", "RunLogWriteError", "SparsityProbe",
    "WeightsProbe", "find_runs", "make_probe", "read_run", "register_probe",
]
