"""runlog: the crash-safe HDF5 run log, one file per training run, one writer, any number of readers.

Reading a log imports neither torch nor the rest of the toolkit (``tests/test_runlog.py`` pins it). Floors, each
importing only those below it: :mod:`runlog.format` (the layout, version, errors, fields, attribute codec and its
digest) <- :mod:`runlog.reader` (reading in this process) <- :mod:`runlog.bounded` (reads bounded in time: a child
process checks each file first) <- :mod:`runlog.repair` (opening a log to append: repair, trim, resume) <-
:mod:`runlog.writer` (:class:`RunLog`). Beside them: :mod:`runlog.schema` (what each probe field means, for
reports), :mod:`runlog.provenance` (what made a run) and :mod:`runlog.failpoints` (kill points for fault tests).
"""

from .bounded import TIMEOUT_S, check_logs, read_log_id, read_run
from .format import END, RUN_END, Field, RunLogBusy, RunLogError, RunLogWriteError
from .reader import Run, find_runs
from .schema import FieldDoc, ProbeSchema, default_doc
from .writer import RunLog

__all__ = [
    "END", "RUN_END", "TIMEOUT_S", "Field", "FieldDoc", "ProbeSchema", "Run", "RunLog", "RunLogBusy", "RunLogError",
    "RunLogWriteError", "check_logs", "default_doc", "find_runs", "read_log_id", "read_run",
]
