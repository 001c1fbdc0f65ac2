"""A self-contained ``index.html``: tables and figures (PNG files referenced by relative path). Stdlib only."""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Table", "Part", "write_index"]

_STYLE = """
body { font-family: sans-serif; margin: 2em; }
table { border-collapse: collapse; margin-bottom: 2em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f0f0f0; }
figure { margin: 1em 0 2em 0; }
img { max-width: 100%; }
figcaption { color: #555; font-size: 0.9em; }
nav a { margin-right: 1em; }
p.note { color: #555; font-size: 0.9em; }
footer { color: #555; font-size: 0.85em; border-top: 1px solid #ccc; margin-top: 3em; padding-top: 0.5em; }
"""


#: tables of more rows are folded (``<details>``)
FOLD_ROWS = 30


@dataclass(frozen=True)
class Table:
    """A table: `heading`, column names, and rows of cell texts (escaped when written)."""

    heading: str
    columns: Sequence[str]
    rows: Sequence[Sequence[str]]


def _table(table: Table, level: int = 2) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>\n"
                   for row in table.rows)
    heading = f"<h{level}>{html.escape(table.heading)}</h{level}>\n"
    if len(table.rows) > FOLD_ROWS:  # a study's hundreds of runs: folded, one click away
        return (f"{heading}<details><summary>{len(table.rows)} rows</summary>\n<table>\n<tr>{head}</tr>\n{body}"
                "</table></details>\n")
    return f"{heading}<table>\n<tr>{head}</tr>\n{body}</table>\n"


def _figure(caption: str, src: str) -> str:
    src = html.escape(Path(src).as_posix(), quote=True)
    text = html.escape(caption)
    return f'<figure><img src="{src}" alt="{text}"><figcaption>{text}</figcaption></figure>\n'


@dataclass(frozen=True)
class Part:
    """A section of its own (``<h2>``, with an anchor and a link at the top of the page): notes, tables, then
    figure sections ``{heading: [(caption, png path)]}`` as ``<h3>``."""

    heading: str
    tables: Sequence[Table] = ()
    sections: Mapping[str, Sequence[tuple[str, str]]] = field(default_factory=dict)
    notes: Sequence[str] = ()


def _anchor(heading: str) -> str:
    return "part-" + "".join(c if c.isalnum() else "-" for c in heading).strip("-").lower()


def _sections(sections: Mapping[str, Sequence[tuple[str, str]]], level: int) -> list[str]:
    out = []
    for heading, figures in sections.items():
        if figures:
            out.append(f"<h{level}>{html.escape(heading)}</h{level}>\n")
            out += [_figure(caption, src) for caption, src in figures]
    return out


def write_index(out_dir: str | os.PathLike, title: str, tables: Sequence[Table] = (),
                sections: Mapping[str, Sequence[tuple[str, str]]] | None = None, *, parts: Sequence[Part] = (),
                notes: Sequence[str] = (), links: Sequence[tuple[str, str]] = ()) -> Path:
    """Write ``out_dir/index.html`` and return its path: `notes` and `links` ``[(text, href)]``, `tables`, then
    `sections` ``{heading: [(caption, png path relative to out_dir)]}`` (empty sections are left out), then
    `parts` (a link to each at the top); the paper is cited at the foot of every page."""
    from .paper import CITATION

    parts_html = [f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>",
                  f"<style>{_STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>\n"]
    parts_html += [f'<p class="note">{html.escape(n)}</p>\n' for n in notes]
    nav = [*links, *((p.heading, f"#{_anchor(p.heading)}") for p in parts)] if len(parts) > 1 or links else []
    if nav:
        parts_html.append("<nav>" + "".join(f'<a href="{html.escape(href, quote=True)}">{html.escape(text)}</a>'
                                            for text, href in nav) + "</nav>\n")
    parts_html += [_table(t) for t in tables]
    parts_html += _sections(sections or {}, 2)
    for part in parts:
        parts_html.append(f'<h2 id="{_anchor(part.heading)}">{html.escape(part.heading)}</h2>\n')
        parts_html += [f'<p class="note">{html.escape(n)}</p>\n' for n in part.notes]
        parts_html += [_table(t, level=3) for t in part.tables]
        parts_html += _sections(part.sections, 3)
    parts_html.append(f"<footer>Method: {html.escape(CITATION)}.</footer>\n</body></html>\n")
    path = Path(out_dir) / "index.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(parts_html), encoding="utf-8")
    return path
