"""Class-incremental streaming classification (the paper's appendix "Class Incremental Learning"): Tables tb:mnist
and tb:cifar, the accuracy curves, accuracy matrices and forgetting, and the probes between tasks, from run logs.

Reads the run logs that ``python -m agents.train class-inc`` writes (``algo`` ``"class-inc"``, one per seed under
``OUT/class-inc/<data>/<model>-<act>[-ewc]/w<width>-bs<batch>/<tag>/seed<k>/run.h5``: scalars ``test_acc`` (classes
seen so far; step = training samples seen), ``task_acc_<j>`` at every task end (the rows of the accuracy matrix) and
``final_acc``; probes ``gradcov`` and ``sparsity`` at task ends) and compares them with the paper's numbers, kept in
``reports/reference/class_inc.json``.

:mod:`.data` only reads (numpy, dataclasses); :mod:`.page` draws the figures, writes the report and is the command
line::

    python -m reports.classinc RUNS_DIR [RUNS_DIR ...] -o OUT/

A method is (model, activation, Streaming EWC on or off), named as the paper (MLP, MLP+Streaming EWC, EMLP, CNN,
CNN+Streaming EWC, ECNN); a setting is every config key except the seed and what only says where or how a run was
written (device, probes, data folder, task list). Per (data, width, method) the setting with the highest mean final
accuracy over its seeds is selected; the tables report mean ± standard error (``std(ddof=1) / sqrt(n)``) over seeds.
Settings with fewer seeds than the most common number at their data and width are listed, flagged, and selected only
where a method has no other. Runs that diverged, were interrupted or have no final accuracy are listed and left out.
"""

from .data import (ALGO, MAKE_RUNS, METHOD_NAMES, NOT_SETTING, REFERENCE, TABLE_CAPTION, TASK_PROBES, Forgetting,
                   LeftOut, SettingRow, accuracy_curve, accuracy_matrix, best_settings, exclusion, final_acc,
                   forgetting, forgetting_table, incomplete_matrices, is_classinc_run, mean_task_ends, method_name,
                   method_of, n_tasks, paper_dataset, paper_rows, paper_value, reference_data, sections, setting_key,
                   sweep, task_ends, task_probe, usable_runs)
from .page import (accuracy_figure, best_cells, build_classinc_report, classinc_markdown, forgetting_cells, main,
                   matrix_cells, matrix_figure, method_colors, paper_cells, probe_figure, sweep_cells)

__all__ = [
    "ALGO", "MAKE_RUNS", "METHOD_NAMES", "NOT_SETTING", "REFERENCE", "TABLE_CAPTION", "TASK_PROBES", "Forgetting",
    "LeftOut", "SettingRow", "accuracy_curve", "accuracy_matrix", "best_settings", "exclusion", "final_acc",
    "forgetting", "forgetting_table", "incomplete_matrices", "is_classinc_run", "mean_task_ends", "method_name",
    "method_of", "n_tasks", "paper_dataset", "paper_rows", "paper_value", "reference_data", "sections", "setting_key",
    "sweep", "task_ends", "task_probe", "usable_runs", "accuracy_figure", "best_cells", "build_classinc_report",
    "classinc_markdown", "forgetting_cells", "main", "matrix_cells", "matrix_figure", "method_colors", "paper_cells",
    "probe_figure", "sweep_cells",
]
