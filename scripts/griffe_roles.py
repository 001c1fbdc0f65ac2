"""Griffe extension for the API reference (mkdocs.yml loads it): the docstrings' reST bits as Markdown.

The docstrings are Google-style (``Args:``, ``Returns:``, ``Raises:``) with reST inline markup: ``double backticks``
(already code in Markdown), Sphinx roles such as ``:func:`interference.ntk``` and ``::`` before a literal block.
This turns each role into an optional cross-reference (a link where the target is on a reference page, plain code
otherwise: never a warning) and a paragraph's closing ``::`` into ``:``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|data|attr|obj|exc|const)?:`(~?)([A-Za-z_][\w.]*)(\(\))?`")
_LITERAL = re.compile(r"(\S)::[ \t]*\n(?=[ \t]*\n)")


def _qualify(name: str, obj: griffe.Object) -> str:
    """A dotted path for ``name``: as written when it has a dot, else beside ``obj`` (its class or module)."""
    if "." in name:
        return name
    scope = obj if obj.is_class or obj.is_module else obj.parent
    return f"{scope.path}.{name}" if scope is not None else name


def markdown(text: str, obj: griffe.Object) -> str:
    """``text`` with its roles as optional autorefs and its literal-block ``::`` as ``:``."""

    def role(match: re.Match) -> str:
        short, name, call = match.group(1), match.group(2), match.group(3) or ""
        shown = (name.rsplit(".", 1)[-1] if short else name) + call
        return f'<autoref identifier="{_qualify(name, obj)}" optional><code>{shown}</code></autoref>'

    return _LITERAL.sub(r"\1:\n", _ROLE.sub(role, text))


class ReSTRoles(griffe.Extension):
    """Rewrites every docstring as :func:`markdown` says, as the objects are loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value, obj)
