"""Figures of probe fields from their schemas (:mod:`probes.schema`), for any probe, a plugin's included.

Per probe, the fields are plotted as their docs say: ``curve`` fields one figure each (mean over seeds, shaded
standard error, a line per configuration); ``per_layer`` fields of one probe that share their entry names and units
one figure per configuration (a panel per field, a line per entry: the sparsity probe's four fields per activation
layer); ``layer_range`` fields likewise, as a line (mean) and a band (min to max) per layer (Elephant's ``h`` and
``a``); ``heatmap`` fields a row of matrices per configuration at the chosen steps.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from matplotlib.figure import Figure

from probes.runlog import Run
from probes.schema import FieldDoc

from . import data, plots
from .labels import step_label

__all__ = ["probe_figures", "slug"]

#: ``add(section, caption, file name, figure)``
Add = Callable[[str, str, str, Figure], None]


def slug(text: str) -> str:
    """``text`` as a safe piece of a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def _labels(doc: FieldDoc, field: str) -> str | None:
    """The probe setting naming a field's entries; ``{prefix}`` stands for the field name up to its last ``_``."""
    return None if doc.labels is None else doc.labels.format(prefix=field.rpartition("_")[0])


def _entries(run: Run, probe: str, doc: FieldDoc, field: str, n: int) -> list[str]:
    key = _labels(doc, field)
    if key is not None:
        return data.layer_names(run, probe, key, n)
    return [f"{(doc.axes or ('entry',))[0]} {j}" for j in range(n)]


def probe_figures(add: Add, groups: Mapping[str, list[Run]], colors: dict[str, str], steps: Sequence[int] | None,
                  skip: Callable[[str, str], bool]) -> None:
    """Add a figure for every probe field in ``groups`` but those ``skip(probe, field)`` (hand-made elsewhere)."""
    runs = [r for group in groups.values() for r in group]
    for probe, fields in data.probe_fields(runs).items():
        schema = data.probe_schema(next(r for r in runs if probe in r.probes), probe)
        docs = {}
        for field in sorted(fields, key=schema.rank):  # stable: fields of one pattern stay in file order
            if not skip(probe, field):
                owner = next(r for r in runs if field in r.probes.get(probe, {}))
                docs[field] = data.field_doc(owner, probe, field)
        if not docs:
            continue
        title = schema.title
        for field, doc in docs.items():
            caption = f"{probe}.{field}: {doc.meaning}" + (f" ({doc.units})" if doc.units else "")
            if doc.plot == "curve":
                _curve(add, groups, colors, title, probe, field, doc, caption)
            elif doc.plot == "heatmap":
                _heatmap(add, groups, steps, title, probe, field, doc, caption)
        for kind in ("per_layer", "layer_range"):
            families: dict[tuple, list[str]] = {}
            for field, doc in docs.items():
                if doc.plot == kind:  # one figure: same entry names, units and record shape
                    shape = next(r for r in runs if field in r.probes.get(probe, {})).probes[probe][field].shape[1:]
                    families.setdefault((_labels(doc, field), doc.units, shape), []).append(field)
            for n, family in enumerate(families.values()):
                _per_layer(add, groups, title, probe, family, docs, kind, f"{slug(probe)}_{kind}{n}")


def _curve(add: Add, groups: Mapping[str, list[Run]], colors: dict[str, str], title: str, probe: str, field: str,
           doc: FieldDoc, caption: str) -> None:
    curves = {label: s for label, group in groups.items()
              if (s := data.probe_series(group, probe, field)) is not None and s.values.ndim == 2}
    if curves:
        config = next(iter(groups.values()))[0].config
        add(title, f"{caption}; mean over seeds ± standard error", f"probe_{slug(probe)}_{slug(field)}.png",
            plots.mean_curves({doc.units or field: curves}, title=f"{probe}.{field}: mean ± SE over n seeds",
                              colors=colors, xlabel=step_label(config)))


def _heatmap(add: Add, groups: Mapping[str, list[Run]], steps: Sequence[int] | None, title: str, probe: str,
             field: str, doc: FieldDoc, caption: str) -> None:
    panels = {label: [r for r in data.select_records(group[0], probe, field, steps) if r.value.ndim == 2]
              for label, group in groups.items()}
    panels = {label: records for label, records in panels.items() if records}
    if panels:
        add(title, f"{caption}; one seed per configuration", f"probe_{slug(probe)}_{slug(field)}.png",
            plots.heatmaps(panels, f"{probe}.{field}", doc.axes if len(doc.axes) == 2 else ("i", "j")))


def _per_layer(add: Add, groups: Mapping[str, list[Run]], title: str, probe: str, family: list[str],
               docs: Mapping[str, FieldDoc], kind: str, name: str) -> None:
    ndim = 3 if kind == "per_layer" else 4  # (runs, steps, entries) or (runs, steps, layers, mean/min/max)
    first = docs[family[0]]
    for i, (label, group) in enumerate(groups.items()):
        found = {f: s for f in family if (s := data.probe_series(group, probe, f)) is not None and s.values.ndim == ndim}
        if not found:
            continue
        f0, s0 = next(iter(found.items()))
        entries = _entries(group[0], probe, docs[f0], f0, s0.values.shape[2])
        if kind == "per_layer":
            fraction = first.units == "fraction"
            fig = plots.layer_series(found, entries, label, ylabel=first.units or "value",
                                     ylim=(-0.02, 1.02) if fraction else None, xlabel=step_label(group[0].config))
        else:
            fig = plots.layer_ranges(found, entries, label, xlabel=step_label(group[0].config))
        meanings = "; ".join(f"{probe}.{f}: {docs[f].meaning}" for f in found)
        add(title, f"{label}: {meanings}; mean over {len(group)} seed(s)", f"probe_{name}_{i}.png", fig)
