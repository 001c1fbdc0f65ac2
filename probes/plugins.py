"""Plugins: a user's own activations, probes and algorithms, registered by importing their module.

A plugin module registers what it defines when imported (``interference.register_activation``,
``probes.register_probe``, ``agents.commands.register_command``). It is loaded

* by name: ``python -m agents.train --import MODULE ...`` and ``python -m agents.grid --import MODULE`` (or
  ``import: [MODULE]`` in the grid file); grid workers import the same modules before each run;
* or by installing a package that declares an entry point in the group ``interference.plugins`` (loaded by
  every CLI on start)::

      [project.entry-points."interference.plugins"]
      my_acts = "my_package.acts"

Every run log records the loaded plugins (module and file) in its provenance.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from importlib.metadata import entry_points

from runlog.provenance import report_plugins

__all__ = ["ENTRY_POINT_GROUP", "PluginError", "load_plugins", "loaded_plugins"]

ENTRY_POINT_GROUP = "interference.plugins"
_LOADED: dict[str, str] = {}  # module name -> its file


class PluginError(ImportError):
    """A plugin module that cannot be imported (the message names it and the cause)."""


def _load(name: str, origin: str) -> None:
    if name in _LOADED:
        return
    try:
        module = importlib.import_module(name)
    except Exception as err:  # noqa: BLE001  (a plugin may fail in any way; say which one and why)
        raise PluginError(f"cannot import plugin module {name!r} ({origin}): {type(err).__name__}: {err}") from err
    _LOADED[name] = str(getattr(module, "__file__", None) or "")


def load_plugins(modules: Iterable[str] = (), *, entry_point_plugins: bool = True) -> list[str]:
    """Import the plugin ``modules`` and (unless disabled) every ``interference.plugins`` entry point, once each;
    returns the names of all plugins loaded so far. Raises :class:`PluginError` naming a module that fails."""
    if entry_point_plugins:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            _load(ep.value.split(":")[0], f"entry point {ep.name!r}")
    for name in modules:
        _load(str(name), "--import")
    return list(_LOADED)


def loaded_plugins() -> dict[str, str]:
    """Plugin modules loaded in this process, with their files (recorded in run logs' provenance)."""
    return dict(_LOADED)


report_plugins(loaded_plugins)
