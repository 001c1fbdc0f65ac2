"""A self-contained ``index.html``: tables and figures (PNG files referenced by relative path). Stdlib only."""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Table", "write_index"]

_STYLE = """
body { font-family: sans-serif; margin: 2em; }
table { border-collapse: collapse; margin-bottom: 2em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f0f0f0; }
figure { margin: 1em 0 2em 0; }
img { max-width: 100%; }
figcaption { color: #555; font-size: 0.9em; }
"""


@dataclass(frozen=True)
class Table:
    """A table: `heading`, column names, and rows of cell texts (escaped when written)."""

    heading: str
    columns: Sequence[str]
    rows: Sequence[Sequence[str]]


def _table(table: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>\n"
                   for row in table.rows)
    return f"<h2>{html.escape(table.heading)}</h2>\n<table>\n<tr>{head}</tr>\n{body}</table>\n"


def _figure(caption: str, src: str) -> str:
    src = html.escape(Path(src).as_posix(), quote=True)
    text = html.escape(caption)
    return f'<figure><img src="{src}" alt="{text}"><figcaption>{text}</figcaption></figure>\n'


def write_index(out_dir: str | os.PathLike, title: str, tables: Sequence[Table],
                sections: Mapping[str, Sequence[tuple[str, str]]]) -> Path:
    """Write ``out_dir/index.html`` with `tables` then `sections` ``{heading: [(caption, png path relative
    to out_dir)]}`` (empty sections are left out) and return its path."""
    parts = [f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>",
             f"<style>{_STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>\n"]
    parts += [_table(t) for t in tables]
    for heading, figures in sections.items():
        if figures:
            parts.append(f"<h2>{html.escape(heading)}</h2>\n")
            parts += [_figure(caption, src) for caption, src in figures]
    parts.append("</body></html>\n")
    path = Path(out_dir) / "index.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(parts), encoding="utf-8")
    return path
