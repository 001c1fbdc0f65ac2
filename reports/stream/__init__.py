"""Streaming regression on sin(pi x) (the paper's section 6.1): Table tb:sin, Figure 2a and Figure 2b from run logs.

Reads the run logs that ``python -m agents.train stream-sin`` and ``... edit`` write (``algo`` ``"stream-sin"``:
scalar ``test_mse`` after each sample, probes ``outputs``/``ntk``/``inputs`` at a few steps; ``algo`` ``"edit"``:
one record of probe ``edit``) and compares them with the paper's numbers in :mod:`reports.paper`.

:mod:`.data` only reads (numpy, dataclasses), :mod:`.plots` draws (matplotlib figures built without pyplot), and
:mod:`.page` writes the report and is the command line::

    python -m reports.stream RUNS_DIR [RUNS_DIR ...] -o OUT/ [--seeds-note TEXT] [--steps 1,50,200]

Selection follows the paper's appendix: per method, the learning rate (for SR-NN also the activation, the Set-KL
weight lambda > 0 and the target sparsity beta) whose final test MSE, averaged over seeds, is lowest; the table
reports mean +- standard error (``std(ddof=1) / sqrt(n)``) over seeds of the final test MSE at that setting.
"""

from .data import (EDIT_ALGO, STREAM_ALGO, TABLE_CAPTION, EditRecord, EditRow, EditTable, SineSnapshot, StreamRow,
                   SweepRow, best_runs, config_label, edit_records, edit_table, final_mse, incomplete_runs, is_edit_run,
                   is_stream_run, lr_sweep, method_of, seeds_phrase, sine_snapshots, stream_table, table_caption)
from .page import build_stream_report, edit_markdown, main, stream_markdown, sweep_markdown
from .plots import edit_figure, mse_curves, sine_panels

__all__ = [
    "STREAM_ALGO", "EDIT_ALGO", "TABLE_CAPTION", "table_caption", "seeds_phrase", "SweepRow", "StreamRow",
    "SineSnapshot", "EditRecord", "EditRow", "EditTable", "is_stream_run", "is_edit_run", "method_of", "config_label",
    "final_mse", "incomplete_runs",
    "lr_sweep", "stream_table", "best_runs", "sine_snapshots", "edit_records", "edit_table", "sine_panels",
    "mse_curves", "edit_figure", "stream_markdown", "sweep_markdown", "edit_markdown", "build_stream_report",
    "main",
]
