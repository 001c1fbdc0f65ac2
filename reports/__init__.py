"""Reports: run logs (HDF5, see :mod:`runlog`) in, figures and an ``index.html`` out.

:mod:`reports.data` turns :class:`~runlog.Run` objects into numpy arrays (no plotting);
:mod:`reports.plots` draws them with matplotlib; :mod:`reports.html` writes the page;
:func:`reports.build.build_report` does all of it, as does ``python -m reports RUN.h5 ... -o OUT/``.
"""

from .data import (
    CurrentNTK, Curve, Record, Series, config_key, config_labels, current_ntk, default_steps, final_return,
    finished, gradcov_losses, group_by_config, layer_names, learning_curve, nearest_record, ntk_kind, ntk_matrix,
    probe_inputs, probe_series, run_end, select_records, training_length,
)

__all__ = [
    "CurrentNTK", "Curve", "Record", "Series", "config_key", "config_labels", "current_ntk", "default_steps",
    "final_return", "finished", "gradcov_losses", "group_by_config", "layer_names", "learning_curve",
    "nearest_record", "ntk_kind", "ntk_matrix", "probe_inputs", "probe_series", "run_end", "select_records",
    "training_length",
]
