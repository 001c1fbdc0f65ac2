"""One declaration per activation: what nets, RL policies, learners, CLIs and probes need to know about it.

An :class:`ActivationSpec` holds the module factory, the arguments a user may set (type and help; defaults come
from the factory's signature), and the activation's *default* conventions: a LayerNorm before it, the spread of
the hidden biases (``sigma_bias``), the width its block outputs, whether it takes one parameter per unit
(``num_units``) and which per-unit parameters the weights probe logs. Experiments override the conventions in
their own configs (the paper uses Elephant without LayerNorm and ``sigma_bias`` 1.28 on the streaming task,
with LayerNorm and 0.4 in classic-control DQN, 2 on Atari); nothing outside this module compares activation names.

Register your own with :func:`register_activation` (e.g. in a plugin module loaded with ``--import MODULE``)::

    register_activation(ActivationSpec("swish", Swish, {"beta": ActArg(float, "Swish beta")}))
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .activations import FTA, LWTA, Elephant, Maxout

__all__ = ["ActArg", "ActivationSpec", "register_activation", "activation_spec", "activation_names",
           "activation_types", "make_activation", "module_spec", "output_width"]


@dataclass(frozen=True)
class ActArg:
    """A user-settable argument of an activation: its type (``float``, ``int`` or ``bool``) and a help line."""

    type: type
    help: str


_KINDS = {float: "a number", int: "an integer", bool: "true or false"}


def _same_width(module: nn.Module, width: int) -> int:
    return width


def _one(module: nn.Module) -> int:
    return 1


@dataclass(frozen=True)
class ActivationSpec:
    """An activation and its default conventions.

    Attributes:
        name: the (lower-case) name CLIs and configs use.
        factory: ``factory(**arguments[, num_units=width]) -> nn.Module`` acting on the last dimension.
        arguments: the arguments users may set, by name (``num_units`` is never one: it follows the layer width).
        layer_norm: whether a hidden block puts a LayerNorm before the activation by default.
        sigma_bias: default spread of the hidden biases over ``[-sqrt(3) s, sqrt(3) s]``; ``None``: zero biases.
        per_unit: whether the factory takes ``num_units`` (one parameter per unit, e.g. Elephant's ``h`` and ``a``).
        width_rule: ``(module, linear_width) -> output width``; raises ValueError for a width the module cannot
            take.
        width_multiple: ``module -> m``: hidden widths must be multiples of ``m`` (width matching steps by it).
        module_type: the class of the modules the factory builds (probes find activation layers by it; default
            ``factory`` when it is a class).
        unit_parameters: per-unit tensors (attributes of the module) the weights probe logs as mean/min/max.
    """

    name: str
    factory: Callable[..., nn.Module]
    arguments: Mapping[str, ActArg] = field(default_factory=dict)
    layer_norm: bool = False
    sigma_bias: float | None = None
    per_unit: bool = False
    width_rule: Callable[[nn.Module, int], int] = _same_width
    width_multiple: Callable[[nn.Module], int] = _one
    module_type: type[nn.Module] | None = None
    unit_parameters: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or self.name != self.name.lower():
            raise ValueError(f"activation names are non-empty and lower case, got {self.name!r}")
        if "num_units" in self.arguments:
            raise ValueError(f"{self.name}: num_units follows the layer width; declare per_unit=True instead")
        bad = [a for a, arg in self.arguments.items() if arg.type not in (float, int, bool)]
        if bad:
            raise ValueError(f"{self.name}: argument types must be float, int or bool ({bad})")
        if self.module_type is None:
            if not isinstance(self.factory, type):
                raise ValueError(f"{self.name}: give module_type when the factory is not a class")
            object.__setattr__(self, "module_type", self.factory)

    def defaults(self) -> dict[str, Any]:
        """The arguments' default values, from the factory's signature (missing: no default)."""
        try:
            params = inspect.signature(self.factory).parameters
        except (TypeError, ValueError):
            return {}
        return {n: params[n].default for n in self.arguments
                if n in params and params[n].default is not inspect.Parameter.empty}

    def check_arguments(self, kwargs: Mapping[str, Any]) -> None:
        """ValueError naming the arguments this activation does not take."""
        unknown = sorted(set(kwargs) - set(self.arguments))
        if unknown:
            takes = ", ".join(self.arguments) if self.arguments else "no arguments"
            raise ValueError(f"activation {self.name!r} does not take {', '.join(unknown)}; it takes {takes}")

    def parse_arguments(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` (from flags or a config file) checked against the declared arguments, an int for a float
        argument made a float; ValueError naming an argument this activation does not take or a value of the
        wrong type."""
        self.check_arguments(values)
        parsed: dict[str, Any] = {}
        for name, value in values.items():
            kind = self.arguments[name].type
            of_kind = isinstance(value, (int, float) if kind is float else kind)
            if isinstance(value, bool) != (kind is bool) or not of_kind:
                raise ValueError(f"activation {self.name!r}: {name} must be {_KINDS[kind]}, got {value!r}")
            parsed[name] = float(value) if kind is float else value
        return parsed

    def build(self, width: int | None = None, **kwargs: Any) -> nn.Module:
        """The module for a hidden layer of ``width`` Linear units; a per-unit activation gets
        ``num_units=width`` unless ``kwargs`` sets it (``None``: parameters shared by all units)."""
        self.check_arguments({k: v for k, v in kwargs.items() if not (self.per_unit and k == "num_units")})
        if self.per_unit:
            kwargs.setdefault("num_units", width)
        return self.factory(**kwargs)

    def output_width(self, module: nn.Module, width: int) -> int:
        """The width ``module`` outputs after a Linear layer of ``width`` units."""
        return self.width_rule(module, width)


_SPECS: dict[str, ActivationSpec] = {}


def register_activation(spec: ActivationSpec, *, replace: bool = False) -> ActivationSpec:
    """Make ``spec`` available by name to every part of the toolkit; ``replace=True`` to redefine a name."""
    if spec.name in _SPECS and not replace:
        raise ValueError(f"activation {spec.name!r} is registered already (pass replace=True to redefine it)")
    _SPECS[spec.name] = spec
    return spec


def activation_names() -> list[str]:
    """Names of the registered activations, sorted."""
    return sorted(_SPECS)


def activation_spec(name: str) -> ActivationSpec:
    """The spec of activation ``name`` (case-insensitive); ValueError naming the choices if unknown."""
    key = str(name).lower()
    if key not in _SPECS:
        raise ValueError(f"unknown activation {name!r}; choose one of {', '.join(activation_names())}")
    return _SPECS[key]


def activation_types() -> tuple[type[nn.Module], ...]:
    """The module classes of all registered activations (the layers activation probes measure)."""
    return tuple(dict.fromkeys(s.module_type for s in _SPECS.values()))


def make_activation(name: str, **kwargs: Any) -> nn.Module:
    """Build an activation module by (case-insensitive) name, e.g. ``make_activation("elephant", d=8, a=0.08)``.

    Per-unit activations take ``num_units`` here too (``None``: shared parameters). Raises ``ValueError`` for an
    unknown name or an argument the activation does not take.
    """
    return activation_spec(name).build(None, **kwargs)


def module_spec(module: nn.Module) -> ActivationSpec | None:
    """The spec whose ``module_type`` is exactly ``type(module)``, or None."""
    return next((s for s in _SPECS.values() if type(module) is s.module_type), None)


def output_width(module: nn.Module, units: int) -> int:
    """Width an activation module produces from ``units`` inputs (``units`` for modules of no registered spec)."""
    spec = module_spec(module)
    return units if spec is None else spec.output_width(module, units)


# --- the built-in activations ------------------------------------------------------------------------


def _group_width(name: str, reduce: bool) -> Callable[[nn.Module, int], int]:
    def rule(module: nn.Module, width: int) -> int:
        if width % module.k:
            raise ValueError(f"{name}(k={module.k}): width {width} is not divisible by k")
        return width // module.k if reduce else width

    return rule


_K_GROUP = ActArg(int, "group size of Maxout/LWTA, number of tiles of FTA")
for _spec in (
    ActivationSpec("relu", nn.ReLU),
    ActivationSpec("tanh", nn.Tanh),
    ActivationSpec("sigmoid", nn.Sigmoid),
    ActivationSpec("elu", nn.ELU, {"alpha": ActArg(float, "ELU alpha")}),
    ActivationSpec("leaky_relu", nn.LeakyReLU, {"negative_slope": ActArg(float, "LeakyReLU slope for x < 0")}),
    ActivationSpec("gelu", nn.GELU),
    ActivationSpec("silu", nn.SiLU),
    ActivationSpec(
        "elephant", Elephant,
        {"d": ActArg(float, "Elephant slope exponent d"),
         "h": ActArg(float, "Elephant height h (initial value; learnable unless --no-learnable)"),
         "a": ActArg(float, "Elephant half-width a (initial value; learnable unless --no-learnable)"),
         "learnable": ActArg(bool, "learn Elephant's h and a per unit (the paper's setting)")},
        layer_norm=True, sigma_bias=0.4, per_unit=True, unit_parameters=("h", "a")),
    ActivationSpec("maxout", Maxout, {"k": _K_GROUP}, width_rule=_group_width("Maxout", reduce=True),
                   width_multiple=lambda m: m.k),
    ActivationSpec("lwta", LWTA, {"k": _K_GROUP}, width_rule=_group_width("LWTA", reduce=False),
                   width_multiple=lambda m: m.k),
    ActivationSpec("fta", FTA, {"k": _K_GROUP, "bound": ActArg(float, "FTA tiles cover [-bound, bound]"),
                                "eta": ActArg(float, "FTA fuzziness (default: the tile width)")},
                   width_rule=lambda m, w: w * m.k),
):
    register_activation(_spec)
