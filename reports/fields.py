"""Figures of probe fields from their schemas (:mod:`runlog.schema`), for any probe, a plugin's included.

Per probe, the fields are plotted as their docs say: ``curve`` fields one figure each (mean over seeds, shaded
standard error, a line per configuration); ``per_layer`` fields of one probe that share their entry names and units
one figure per configuration (a panel per field, a line per entry: the sparsity probe's four fields per activation
layer); ``layer_range`` fields likewise, as a line (mean) and a band (min to max) per layer (Elephant's ``h`` and
``a``); ``heatmap`` fields a row of matrices per configuration at the chosen steps. Layers are named as a reader
does (``hidden 1``, ``activation 1``, ``output``: :func:`reports.labels.layer_labels`), their module paths in the
caption. A ``curve`` field with one value in every record of every run is not drawn: a note says its value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from runlog import Run
from runlog.schema import FieldDoc

from . import data, plots
from .labels import mean_se_over, seeds, step_label, with_units

__all__ = ["probe_figures", "slug", "one_seed"]

#: ``add(section, caption, file name, figure)``
Add = Callable[[str, str, str, Figure], None]

#: what a caption adds about a field of older logs, by (probe, field): (the field that replaced it, the words);
#: not where the stored meaning names the replacement already (the registry's doc, for logs without a schema)
LEGACY = {("plasticity", "ntk_condition"): (
    "ntk_condition_nonzero", "a field of older logs: the smallest eigenvalue is floored at N eps(float64) lambda_max, "
    "so a singular kernel reads log10(1 / (N eps)), 14.15 for 32 inputs, whatever it is; newer logs record "
    "ntk_condition_nonzero, on the numerically non-zero spectrum")}


def slug(text: str) -> str:
    """``text`` as a safe piece of a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def _labels(doc: FieldDoc, field: str) -> str | None:
    """The probe setting naming a field's entries; ``{prefix}`` stands for the field name up to its last ``_``."""
    return None if doc.labels is None else doc.labels.format(prefix=field.rpartition("_")[0])


def _entries(run: Run, probe: str, doc: FieldDoc, field: str, n: int) -> tuple[list[str], dict[str, str]]:
    """The names of a field's ``n`` entries, and ``{name: module path}`` of the layers among them."""
    key = _labels(doc, field)
    if key is not None:
        return data.entry_labels(run, probe, key, n)
    return [f"{(doc.axes or ('entry',))[0]} {j}" for j in range(n)], {}


def _layers_text(paths: Mapping[str, str]) -> str:
    """``"; layers: hidden 1 = q_net.0, output = q_net.3"``: the module paths of the layers a legend names."""
    return "; layers: " + ", ".join(f"{label} = {path}" for label, path in paths.items()) if paths else ""


def _caption(probe: str, field: str, doc: FieldDoc, units: bool = True, runs: Sequence[Run] = ()) -> str:
    """``probe.field: meaning (units)``, the unit said once (``units``: said at all), the values of the probe's
    settings that the meaning names (``tau = 0.025``, from the ``runs``' logs), and a word on an older logs' field
    (:data:`LEGACY`)."""
    replaced, legacy = LEGACY.get((probe, field), ("", ""))
    text = f"{probe}.{field}: {doc.meaning}"
    text = with_units(text, doc.units) if units else text
    named = _settings(runs, probe, doc.meaning)
    return text + (f", {named}" if named else "") + (f"; {legacy}" if legacy and replaced not in doc.meaning else "")


def _settings(runs: Sequence[Run], probe: str, meaning: str) -> str:
    """``tau = 0.025``: the numeric settings of ``probe`` in the runs' logs that ``meaning`` names as a word
    (``every`` never), each with its values over the runs."""
    values: dict[str, list] = {}
    for run in runs:
        settings = run.attrs.get("probe_settings", {}).get(probe, {})
        for key, value in settings.items() if isinstance(settings, Mapping) else ():
            if key != "every" and isinstance(value, (int, float)) and not isinstance(value, bool) and \
                    re.search(rf"(?<!\w){re.escape(key)}(?!\w)", meaning) and value not in values.get(key, []):
                values.setdefault(key, []).append(value)
    return ", ".join(f"{key} = {' or '.join(f'{v:g}' for v in vs)}" for key, vs in values.items())


def probe_figures(add: Add, groups: Mapping[str, list[Run]], colors: dict[str, str], steps: Sequence[int] | None,
                  skip: Callable[[str, str], bool], note: Callable[[str], None] | None = None) -> None:
    """Add a figure for every probe field in ``groups`` but those ``skip(probe, field)`` (hand-made elsewhere);
    ``note(text)`` gets what is not drawn and why (a curve with one value throughout; without ``note`` it is
    drawn)."""
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
            caption = _caption(probe, field, doc, runs=[r for r in runs if probe in r.probes])
            if doc.plot == "curve":
                _curve(add, groups, colors, title, probe, field, doc, caption, note)
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


def _having(runs: Sequence[Run], probe: str, field: str) -> list[Run]:
    """The runs that have ``probe.field`` (older and newer logs of one configuration may differ in fields)."""
    return [r for r in runs if field in r.probes.get(probe, {})]


def _curve(add: Add, groups: Mapping[str, list[Run]], colors: dict[str, str], title: str, probe: str, field: str,
           doc: FieldDoc, caption: str, note: Callable[[str], None] | None = None) -> None:
    curves = {label: s for label, group in groups.items()
              if (s := data.probe_series(_having(group, probe, field), probe, field)) is not None
              and s.values.ndim == 2}
    if not curves:
        return
    values = np.concatenate([s.values.ravel() for s in curves.values()])
    finite = values[np.isfinite(values)]
    if note is not None and max(len(s.steps) for s in curves.values()) > 1 and (
            finite.size == 0 or np.all(finite == finite[0])):
        what = "has no finite value" if finite.size == 0 else f"is {finite[0]:.4g}"
        note(f"{probe}.{field} {what} in every record of every run (not plotted). {caption}.")
        return
    config = next(iter(groups.values()))[0].config
    over = mean_se_over(len(s.values) for s in curves.values())
    add(title, f"{caption}; {over}", f"probe_{slug(probe)}_{slug(field)}.png",
        plots.mean_curves({with_units(field.replace("_", " "), doc.units): curves}, title=f"{probe}.{field}: {over}",
                          colors=colors, xlabel=step_label(config)))


def _heatmap(add: Add, groups: Mapping[str, list[Run]], steps: Sequence[int] | None, title: str, probe: str,
             field: str, doc: FieldDoc, caption: str) -> None:
    panels = {label: [r for r in data.select_records(group[0], probe, field, steps) if r.value.ndim == 2]
              for label, group in groups.items()}
    panels = {label: records for label, records in panels.items() if records}
    if panels:
        add(title, f"{caption}; {one_seed(panels)}", f"probe_{slug(probe)}_{slug(field)}.png",
            plots.heatmaps(panels, f"{probe}.{field}", doc.axes if len(doc.axes) == 2 else ("i", "j")))


def one_seed(panels: Mapping[str, Sequence]) -> str:
    """``one seed per configuration``, or, for one configuration, its seed (``seed 0``)."""
    if len(panels) == 1 and (records := next(iter(panels.values()))):
        return f"seed {records[0].seed}"
    return "one seed per configuration"


def _per_layer(add: Add, groups: Mapping[str, list[Run]], title: str, probe: str, family: list[str],
               docs: Mapping[str, FieldDoc], kind: str, name: str) -> None:
    ndim = 3 if kind == "per_layer" else 4  # (runs, steps, entries) or (runs, steps, layers, mean/min/max)
    first = docs[family[0]]
    for i, (label, group) in enumerate(groups.items()):
        found = {f: s for f in family
                 if (s := data.probe_series(_having(group, probe, f), probe, f)) is not None and s.values.ndim == ndim}
        if not found:
            continue
        f0, s0 = next(iter(found.items()))
        entries, paths = _entries(_having(group, probe, f0)[0], probe, docs[f0], f0, s0.values.shape[2])
        if kind == "per_layer":
            fraction = first.units == "fraction"
            fig = plots.layer_series(found, entries, label, ylabel=first.units or "value",
                                     ylim=(-0.02, 1.02) if fraction else None, xlabel=step_label(group[0].config))
        else:
            fig = plots.layer_ranges(found, entries, label, xlabel=step_label(group[0].config))
        meanings = "; ".join(_caption(probe, f, docs[f], units=False, runs=group) for f in found)  # units: y axis
        n = len(s0.values)
        add(title, f"{label}: {meanings}; {f'mean over {seeds(n)}' if n > 1 else '1 seed'}{_layers_text(paths)}",
            f"probe_{name}_{i}.png", fig)
