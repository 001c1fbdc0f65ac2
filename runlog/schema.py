"""What a probe's datasets mean, so that reports can render any probe without knowing it.

A probe declares a :class:`ProbeSchema`: a title and, per field (a name or an ``fnmatch`` pattern such as
``*_offdiag_mean``; the first match wins), a :class:`FieldDoc` saying what one record means, its units and axes,
and how to plot it over a run:

* ``curve``: a scalar per record, plotted over steps (mean over seeds, shaded standard error);
* ``per_layer``: a vector per record, one curve per entry; ``labels`` names the probe setting that holds the
  entries' names (e.g. the sparsity probe's ``layers``; ``{prefix}`` stands for the field's name up to its last
  ``_``); fields of one probe with the same labels and units share a figure;
* ``layer_range``: an ``(L, 3)`` record, (mean, min, max) per layer, a line and a band per layer (per-unit
  parameters such as Elephant's ``h`` and ``a``);
* ``heatmap``: a matrix per record, shown at chosen steps (midpoint and end of training by default);
* ``none``: not plotted (e.g. a probe input stored for reference).

:class:`probes.runner.ProbeRunner` stores every probe's schema in the run log (attribute ``probe_schema``), so a
report renders a plugin's probe without importing the plugin. Fields with no declaration are plotted by their
shape (:func:`default_doc`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from fnmatch import fnmatchcase
from typing import Any

__all__ = ["PLOTS", "FieldDoc", "ProbeSchema", "default_doc"]

PLOTS = ("curve", "per_layer", "layer_range", "heatmap", "none")


@dataclass(frozen=True)
class FieldDoc:
    """One field: ``meaning`` of a record, its ``units``, the names of its ``axes``, how to ``plot`` it (one of
    :data:`PLOTS`) and, for ``per_layer``, the probe setting holding the names of axis 0's entries."""

    meaning: str
    units: str = ""
    axes: tuple[str, ...] = ()
    plot: str = "curve"
    labels: str | None = None

    def __post_init__(self) -> None:
        if self.plot not in PLOTS:
            raise ValueError(f"FieldDoc plot must be one of {', '.join(PLOTS)}, got {self.plot!r}")
        object.__setattr__(self, "axes", tuple(self.axes))


@dataclass(frozen=True)
class ProbeSchema:
    """A probe's ``title`` and its fields' docs by name or ``fnmatch`` pattern (first match wins)."""

    title: str
    fields: Mapping[str, FieldDoc] = field(default_factory=dict)

    def doc(self, name: str) -> FieldDoc | None:
        """The doc of field ``name``, or None if no name or pattern matches."""
        if name in self.fields:
            return self.fields[name]
        return next((d for pattern, d in self.fields.items() if fnmatchcase(name, pattern)), None)

    def rank(self, name: str) -> int:
        """Where field ``name`` comes in the declaration order (reports list fields so); undeclared ones last."""
        keys = list(self.fields)
        exact = [i for i, k in enumerate(keys) if k == name]
        return (exact or [i for i, k in enumerate(keys) if fnmatchcase(name, k)] or [len(keys)])[0]

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "fields": {k: asdict(v) for k, v in self.fields.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProbeSchema:
        """The schema of :meth:`to_json`; ValueError if ``data`` is not one."""
        try:
            return cls(str(data["title"]), {str(k): FieldDoc(**v) for k, v in dict(data.get("fields", {})).items()})
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"not a probe schema: {err!r}") from None


def default_doc(shape: tuple[int, ...]) -> FieldDoc:
    """How to plot a field nobody documented, from its per-record ``shape``: a scalar as a curve, a vector per
    entry, a square matrix as a heatmap, anything else not at all."""
    if len(shape) == 0:
        return FieldDoc("(undocumented)", plot="curve")
    if len(shape) == 1:
        return FieldDoc("(undocumented)", plot="per_layer")
    if len(shape) == 2 and shape[0] == shape[1]:
        return FieldDoc("(undocumented)", plot="heatmap")
    return FieldDoc("(undocumented)", plot="none")
