"""Built-in probes: gradient covariance, NTK, outputs, sparsity/dormancy, weights and plasticity."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

import interference
from interference.activation_spec import activation_names, activation_spec, activation_types, module_spec
from interference.noisy import NoisyLinear
from interference.ntk import model_outputs
from interference.plasticity import (effective_rank, feature_norm, interference_mass, kernel_effective_rank,
                                     nonzero_condition_number, numerical_rank, srank)
from interference.sparsity import dormant_units, representation_sparsity, saturated_units

from .probe import Probe, ProbeContext
from runlog import Field
from runlog.schema import FieldDoc, ProbeSchema

LINEAR = (nn.Linear, NoisyLinear)  # what counts as a linear layer (a noisy layer's weight: its mean weight)

__all__ = ["GradCovProbe", "NTKProbe", "OutputsProbe", "SparsityProbe", "WeightsProbe", "PlasticityProbe", "PROBES",
           "make_probe", "register_probe", "activation_modules", "module_kinds"]


def _np(t: Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy()


class GradCovProbe(Probe):
    """The paper's gradient covariance ``C_ij`` over ``k`` training samples, one ``(k, k)`` matrix per loss.

    Also writes, per loss, the mean off-diagonal entry, the fraction of negative off-diagonal entries, and the
    shares of the off-diagonal mass that are negative (interference) and positive (generalisation), for curves.
    """

    name = "gradcov"
    schema = ProbeSchema("Gradient covariance", {
        "*_offdiag_mean": FieldDoc("mean off-diagonal C_ij of one loss", axes=(), plot="curve"),
        "*_negative_fraction": FieldDoc("fraction of negative off-diagonal C_ij (interference)", plot="curve"),
        "*_negative_mass": FieldDoc("share of the off-diagonal mass sum|C_ij| that is negative (interference)",
                                    "fraction", plot="curve"),
        "*_positive_mass": FieldDoc("share of the off-diagonal mass sum|C_ij| that is positive (generalisation)",
                                    "fraction", plot="curve"),
        "*": FieldDoc("gradient covariance C_ij of k training samples under one loss (field name: the loss)",
                      axes=("sample", "sample"), plot="heatmap"),
    })

    def __init__(self, k: int = 32, every: int | None = 1000, at: Sequence[int] = ()) -> None:
        super().__init__(every, at)
        if not isinstance(k, int) or k < 2:
            raise ValueError(f"gradcov: k must be an int >= 2, got {k!r}")
        self.k = k

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "k": self.k}

    def fields(self, ctx: ProbeContext) -> dict[str, Field]:
        if not ctx.losses or ctx.sample is None:
            raise ValueError("gradcov needs training losses and a sample source (ctx.losses, ctx.sample)")
        out = {}
        for loss in ctx.losses:
            out[loss] = Field((self.k, self.k))
            out[f"{loss}_offdiag_mean"] = Field(())
            out[f"{loss}_negative_fraction"] = Field(())
            out[f"{loss}_negative_mass"] = Field(())
            out[f"{loss}_positive_mass"] = Field(())
        return out

    def compute(self, ctx: ProbeContext) -> dict[str, np.ndarray]:
        batch = ctx.sample(self.k)
        off = ~torch.eye(self.k, dtype=torch.bool)
        out = {}
        for name, loss in ctx.losses.items():
            c = interference.gradient_covariance(ctx.model, loss, batch, params=ctx.loss_params.get(name))
            out[name] = _np(c)
            out[f"{name}_offdiag_mean"] = np.float32(c[off].mean().item())
            out[f"{name}_negative_fraction"] = np.float32((c[off] < 0).double().mean().item())
            out[f"{name}_negative_mass"], out[f"{name}_positive_mass"] = map(np.float32, interference_mass(c))
        return out


class NTKProbe(Probe):
    """The empirical NTK on the run's fixed probe inputs.

    ``against="inputs"``: the ``(N, N)`` trace kernel (or ``(N, N, O, O)`` with ``output="full"``).
    ``against="current"``: ``NTK(x, x_t)`` of every probe input against the sample being learned, ``(N,)``
    (trace over outputs), with ``x_t``; ``normalized`` divides by ``max |NTK(x, x_t)|`` as in the paper's Fig. 2a.
    """

    name = "ntk"
    schema = ProbeSchema("NTK", {
        "kernel": FieldDoc("empirical NTK on the probe inputs, (N, N) (or (N, N, O, O)); against the sample being "
                           "learned: NTK(x_i, x_t), (N,)", axes=("input", "input"), plot="heatmap"),
        "x_t": FieldDoc("the sample being learned", plot="none"),
    })

    def __init__(self, every: int | None = 1000, at: Sequence[int] = (), *,
                 output: Literal["trace", "full"] = "trace", against: Literal["inputs", "current"] = "inputs",
                 normalized: bool = False) -> None:
        super().__init__(every, at)
        if output not in ("trace", "full"):
            raise ValueError(f"ntk: output must be 'trace' or 'full', got {output!r}")
        if against not in ("inputs", "current"):
            raise ValueError(f"ntk: against must be 'inputs' or 'current', got {against!r}")
        self.output, self.against, self.normalized = output, against, normalized

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "output": self.output, "against": self.against, "normalized": self.normalized}

    def fields(self, ctx: ProbeContext) -> dict[str, Field]:
        if ctx.inputs is None:
            raise ValueError("ntk needs fixed probe inputs (ctx.inputs)")
        n = ctx.inputs.shape[0]
        if self.against == "current":
            return {"kernel": Field((n,)), "x_t": Field(tuple(ctx.inputs.shape[1:]))}
        with torch.no_grad():
            o = model_outputs(_model_fn(ctx), ctx.inputs[:1]).shape[1]
        return {"kernel": Field((n, n) if self.output == "trace" else (n, n, o, o))}

    def compute(self, ctx: ProbeContext) -> dict[str, np.ndarray]:
        model = _model_fn(ctx)
        if self.against == "current":
            if ctx.current is None:
                raise ValueError("ntk(against='current') needs the current sample (ctx.current)")
            k = interference.ntk(model, ctx.inputs, ctx.current, output="trace")[:, 0]
            if self.normalized:
                k = k / k.abs().max().clamp_min(torch.finfo(k.dtype).tiny)
            return {"kernel": _np(k), "x_t": _np(ctx.current[0])}
        return {"kernel": _np(interference.ntk(model, ctx.inputs, output=self.output))}


class _Forward(nn.Module):
    """``forward(model, x)`` as a module, so the NTK sees the right outputs (e.g. a policy's action logits)."""

    def __init__(self, model: nn.Module, forward) -> None:
        super().__init__()
        self.model = model
        self.fn = forward

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(self.model, x)


class OutputsProbe(Probe):
    """The model's outputs on the fixed probe inputs, ``(N, O)`` (the learned function, Q-values, ...)."""

    name = "outputs"
    schema = ProbeSchema("Outputs", {"y": FieldDoc("the model's outputs on the fixed probe inputs",
                                                   axes=("input", "output"), plot="none")})

    def fields(self, ctx: ProbeContext) -> dict[str, Field]:
        if ctx.inputs is None:
            raise ValueError("outputs needs fixed probe inputs (ctx.inputs)")
        with torch.no_grad():
            o = model_outputs(_model_fn(ctx), ctx.inputs[:1]).shape[1]
        return {"y": Field((ctx.inputs.shape[0], o))}

    def compute(self, ctx: ProbeContext) -> dict[str, np.ndarray]:
        with torch.no_grad():
            return {"y": _np(model_outputs(_model_fn(ctx), ctx.inputs))}


def _model_fn(ctx: ProbeContext) -> nn.Module:
    """``ctx.model``, or ``ctx.forward`` bound to it as a module."""
    return ctx.model if ctx.forward is None else _Forward(ctx.model, ctx.forward)


def activation_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The hidden activation modules of ``model`` (the layers the sparsity probe measures), in forward order: the
    modules of every registered activation spec (plugins' included)."""
    types = activation_types()
    return [(n, m) for n, m in model.named_modules() if isinstance(m, types)]


_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase,
          *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()))


def module_kinds(model: nn.Module) -> list[list[str]]:
    """``[name, kind, class name]`` of every module of ``model`` that is a layer (in registration order): kind
    ``linear`` (``Linear``, ``NoisyLinear``), ``conv``, ``norm`` (LayerNorm, BatchNorm, ...), ``activation`` (any
    registered activation spec's module) or ``other`` (a leaf module of another type). Containers are left out.
    Reports name layers from it as a reader does ("hidden 1", "activation 1", "output"; see
    :func:`reports.labels.layer_labels`)."""
    acts = activation_types()
    out = []
    for name, m in model.named_modules():
        if not name:
            continue
        kind = ("activation" if isinstance(m, acts) else "linear" if isinstance(m, LINEAR) else
                "conv" if isinstance(m, nn.modules.conv._ConvNd) else "norm" if isinstance(m, _NORMS) else
                "other" if not any(True for _ in m.children()) else None)
        if kind is not None:
            out.append([name, kind, type(m).__name__])
    return out


class SparsityProbe(Probe):
    """Sparsity, dormant and saturated units of each hidden activation layer on the fixed probe inputs.

    * ``activation_sparsity``: fraction of outputs with ``|phi| <= eps``;
    * ``gradient_sparsity``: fraction of activation derivatives with ``|phi'| <= eps`` (derivative of the layer's
      summed output w.r.t. its input, which is the elementwise derivative for elementwise activations);
    * ``dormant``: fraction of units with ``mean|phi| / layer mean <= tau`` (Sokar et al. 2023);
    * ``saturated``: fraction of units whose ``|phi'| <= eps`` on every probe input: dead ReLUs, saturated
      Tanh/Sigmoid, and Elephant units whose inputs all lie on its flat tails alike.

    Each field is a vector with one entry per activation layer (names in the probe settings).
    """

    name = "sparsity"
    schema = ProbeSchema("Sparsity and dormancy", {
        "activation_sparsity": FieldDoc("fraction of outputs with |phi| <= eps", "fraction", ("layer",),
                                        "per_layer", "layers"),
        "gradient_sparsity": FieldDoc("fraction of derivatives with |phi'| <= eps", "fraction", ("layer",),
                                      "per_layer", "layers"),
        "dormant": FieldDoc("fraction of dormant units (mean |phi| / layer mean <= tau)", "fraction", ("layer",),
                            "per_layer", "layers"),
        "saturated": FieldDoc("fraction of units with |phi'| <= eps on every probe input", "fraction", ("layer",),
                              "per_layer", "layers"),
    })

    def __init__(self, every: int | None = 1000, at: Sequence[int] = (), *, eps: float = 1e-3, tau: float = 0.0,
                 layers: Sequence[str] | None = None) -> None:
        super().__init__(every, at)
        self.eps, self.tau = float(eps), float(tau)
        self.layers = list(layers) if layers is not None else None

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "eps": self.eps, "tau": self.tau, "layers": self.layers}

    def _run(self, ctx: ProbeContext, x: Tensor, mods: list[tuple[str, nn.Module]]) -> dict[str, Tensor]:
        """Inputs of each module in ``mods`` when the probe forward runs on ``x``."""
        captured: dict[str, Tensor] = {}

        def hook(name):
            return lambda mod, args, out: captured.__setitem__(name, args[0].detach())

        handles = [m.register_forward_hook(hook(n)) for n, m in mods]
        try:
            with torch.no_grad():
                (ctx.forward or (lambda m, v: m(v)))(ctx.model, x)
        finally:
            for h in handles:
                h.remove()
        return captured

    def _modules(self, ctx: ProbeContext) -> list[tuple[str, nn.Module]]:
        found = activation_modules(ctx.model)
        if self.layers is None:  # the activation layers the probe forward reaches (e.g. a policy's actor path)
            reached = self._run(ctx, ctx.inputs[:1], found)
            self.layers = [n for n, _ in found if n in reached]
        named = dict(found)
        missing = [n for n in self.layers if n not in named]
        if missing:
            raise ValueError(f"sparsity: no activation layers named {missing}; found {list(named)}")
        if not self.layers:
            raise ValueError("sparsity: the model has no activation layers on its forward path")
        return [(n, named[n]) for n in self.layers]

    def fields(self, ctx: ProbeContext) -> dict[str, Field]:
        if ctx.inputs is None:
            raise ValueError("sparsity needs fixed probe inputs (ctx.inputs)")
        n = len(self._modules(ctx))
        return {k: Field((n,)) for k in ("activation_sparsity", "gradient_sparsity", "dormant", "saturated")}

    def compute(self, ctx: ProbeContext) -> dict[str, np.ndarray]:
        mods = self._modules(ctx)
        captured = self._run(ctx, ctx.inputs, mods)
        rows = {k: [] for k in ("activation_sparsity", "gradient_sparsity", "dormant", "saturated")}
        for name, mod in mods:
            z = captured[name].requires_grad_(True)
            with torch.enable_grad():
                phi = mod(z)
                (dphi,) = torch.autograd.grad(phi.sum(), z)
            phi = phi.detach()
            rows["activation_sparsity"].append(representation_sparsity(phi, self.eps))
            rows["gradient_sparsity"].append(representation_sparsity(dphi, self.eps))
            rows["dormant"].append(float(dormant_units(phi, self.tau).double().mean()))
            rows["saturated"].append(float(saturated_units(dphi, self.eps).double().mean()))
        return {k: np.asarray(v, dtype=np.float32) for k, v in rows.items()}


def _unit_specs() -> list[tuple[str, tuple[str, ...]]]:
    """(activation name, its per-unit parameters) of every registered spec that declares some."""
    return [(n, activation_spec(n).unit_parameters) for n in activation_names() if activation_spec(n).unit_parameters]


class WeightsProbe(Probe):
    """Norms of every parameter tensor and of its gradient, and per-unit activation parameters (Elephant's h, a).

    Per parameter tensor: its norm and the norm of its current ``.grad`` (NaN before the first update); per
    layer of an activation whose spec declares per-unit parameters (Elephant's ``h`` and ``a``): each as (mean,
    min, max), in fields ``<activation>_<parameter>`` (``elephant_h``), layers in the setting ``<activation>_layers``.
    The setting ``modules`` lists the model's layers with their kinds (:func:`module_kinds`), so that reports can name
    each parameter's layer as a reader does ("hidden 1 weight", "output bias")."""

    name = "weights"
    schema = ProbeSchema("Weights", {
        "param_norm": FieldDoc("norm of each trainable parameter tensor", "L2 norm", ("parameter",), "per_layer",
                               "parameters"),
        "grad_norm": FieldDoc("norm of each parameter's current gradient", "L2 norm", ("parameter",), "per_layer",
                              "parameters"),
        "elephant_h": FieldDoc("Elephant's height h of each unit: mean, min and max over a layer's units",
                               axes=("layer", "mean/min/max"), plot="layer_range", labels="elephant_layers"),
        "elephant_a": FieldDoc("Elephant's half-width a of each unit, in the units of its input: mean, min and max "
                               "over a layer's units", axes=("layer", "mean/min/max"), plot="layer_range",
                               labels="elephant_layers"),
        "*": FieldDoc("a per-unit parameter <activation>_<parameter> (Elephant's h and a) over each layer's units",
                      axes=("layer", "mean/min/max"), plot="layer_range", labels="{prefix}_layers"),
    })

    def fields(self, ctx: ProbeContext) -> dict[str, Field]:
        self.names = [n for n, p in ctx.model.named_parameters() if p.requires_grad]
        self.modules = module_kinds(ctx.model)
        self.units = {act: [n for n, m in ctx.model.named_modules() if (s := module_spec(m)) and s.name == act]
                      for act, _ in _unit_specs()}
        out = {"param_norm": Field((len(self.names),)), "grad_norm": Field((len(self.names),))}
        for act, params in _unit_specs():
            if self.units[act]:
                out.update({f"{act}_{p}": Field((len(self.units[act]), 3)) for p in params})
        return out

    def settings(self) -> dict[str, Any]:
        units = getattr(self, "units", {})
        return {**super().settings(), "parameters": getattr(self, "names", None),
                **{f"{act}_layers": units.get(act) for act, _ in _unit_specs()},
                "modules": getattr(self, "modules", None)}

    def compute(self, ctx: ProbeContext) -> dict[str, np.ndarray]:
        params = dict(ctx.model.named_parameters())
        mods = dict(ctx.model.named_modules())
        with torch.no_grad():
            out = {
                "param_norm": np.array([params[n].norm().item() for n in self.names], dtype=np.float32),
                "grad_norm": np.array([params[n].grad.norm().item() if params[n].grad is not None else np.nan
                                       for n in self.names], dtype=np.float32),
            }
            for act, attrs in _unit_specs():
                for attr in attrs if self.units[act] else ():
                    vals = [getattr(mods[n], attr) for n in self.units[act]]
                    out[f"{act}_{attr}"] = np.array([[v.mean().item(), v.min().item(), v.max().item()] for v in vals],
                                                    dtype=np.float32)
        return out


class PlasticityProbe(Probe):
    """Loss-of-plasticity measures on the fixed probe inputs: feature ranks, dormant units, weight norms, NTK ranks.

    From :mod:`interference.plasticity`:


    * ``effective_rank`` and ``srank`` (``1 - delta`` of the singular-value mass) of the penultimate features, the
      input of the last ``Linear`` (or ``NoisyLinear``) layer the probe forward reaches (a Q-network's or an actor's
      head; Rainbow's advantage head);
    * ``feature_norm``: mean L2 norm of those features;
    * ``dormant``: per hidden activation layer, the fraction of ReDo-dormant units (score ``<= tau``);
    * ``weight_norm``: per ``Linear`` layer on the forward path, the Frobenius norm of its weight;
    * of the empirical NTK (traced over outputs) on the inputs, ``(N, N)``: ``ntk_effective_rank`` (entropy rank of
      its eigenvalues), ``ntk_numerical_rank`` (eigenvalues above ``N * eps * lambda_max``, ``eps`` of the kernel's
      dtype: numpy's ``matrix_rank`` tolerance) and ``ntk_condition_nonzero``, ``log10`` of its condition number on
      that numerically non-zero spectrum (:func:`~interference.plasticity.nonzero_condition_number`).

    Logs written before ``ntk_condition_nonzero`` have ``ntk_condition`` instead: ``log10`` of the condition number
    with the smallest eigenvalue floored at ``N * eps(float64) * lambda_max``, which reads ``log10(1 / (N eps))``
    (14.15 for 32 inputs) whenever the kernel is singular, as it is on nearby inputs of a low-dimensional task.

    Thresholds ``delta`` and ``tau`` are settings, stored in the run log.
    """

    name = "plasticity"
    schema = ProbeSchema("Plasticity", {
        "effective_rank": FieldDoc("effective rank of the penultimate features on the probe inputs", "rank",
                                   plot="curve"),
        "srank": FieldDoc("srank_delta of the penultimate features (singular values holding 1 - delta)", "rank",
                          plot="curve"),
        "feature_norm": FieldDoc("mean L2 norm of the penultimate features", "L2 norm", plot="curve"),
        "dormant": FieldDoc("fraction of ReDo-dormant units (score <= tau)", "fraction", ("layer",), "per_layer",
                            "layers"),
        "weight_norm": FieldDoc("Frobenius norm of each Linear layer's weight", "L2 norm", ("layer",), "per_layer",
                                "linear_layers"),
        "ntk_effective_rank": FieldDoc("effective rank of the NTK on the probe inputs (entropy of its eigenvalues)",
                                       "rank", plot="curve"),
        "ntk_numerical_rank": FieldDoc("numerical rank of the NTK on the probe inputs: its eigenvalues above "
                                       "N eps lambda_max, eps of the kernel's dtype", "eigenvalues", plot="curve"),
        "ntk_condition_nonzero": FieldDoc("log10 condition number of the NTK on the probe inputs, on the numerically "
                                          "non-zero spectrum: lambda_max over the smallest eigenvalue above N eps "
                                          "lambda_max; at most 1 / (N eps), log10 5.42 for 32 inputs in float32, "
                                          "which it nears where the spectrum decays into round-off: read it with "
                                          "ntk_numerical_rank", "log10", plot="curve"),
        "ntk_condition": FieldDoc("log10 condition number of the NTK on the probe inputs, smallest eigenvalue "
                                  "floored at N eps(float64) lambda_max: reads log10(1 / (N eps)), 14.15 for 32 "
                                  "inputs, whenever the kernel is singular (older logs; newer ones log "
                                  "ntk_condition_nonzero)", "log10", plot="curve"),
    })

    def __init__(self, every: int | None = 1000, at: Sequence[int] = (), *, delta: float = 0.01,
                 tau: float = 0.025) -> None:
        super().__init__(every, at)
        self.delta, self.tau = float(delta), float(tau)
        self.layers: list[str] = []
        self.linear_layers: list[str] = []

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "delta": self.delta, "tau": self.tau, "layers": self.layers,
                "linear_layers": self.linear_layers}

    def _capture(self, ctx: ProbeContext) -> dict[str, Tensor]:
        """Inputs of every activation and Linear module the probe forward reaches on ``ctx.inputs``, in order."""
        mods = [(n, m) for n, m in ctx.model.named_modules() if isinstance(m, (*LINEAR, activation_types()))]
        captured: dict[str, Tensor] = {}
        handles = [m.register_forward_hook(lambda mod, args, out, n=n: captured.__setitem__(n, (args[0], out)))
                   for n, m in mods]
        try:
            with torch.no_grad():
                (ctx.forward or (lambda m, v: m(v)))(ctx.model, ctx.inputs)
        finally:
            for h in handles:
                h.remove()
        return captured

    def fields(self, ctx: ProbeContext) -> dict[str, Field]:
        if ctx.inputs is None:
            raise ValueError("plasticity needs fixed probe inputs (ctx.inputs)")
        captured = self._capture(ctx)
        modules = dict(ctx.model.named_modules())
        self.linear_layers = [n for n in captured if isinstance(modules[n], LINEAR)]
        self.layers = [n for n in captured if not isinstance(modules[n], LINEAR)]
        if not self.linear_layers:
            raise ValueError("plasticity: the probe forward reaches no Linear layer (no penultimate features)")
        return {"effective_rank": Field(()), "srank": Field(()), "feature_norm": Field(()),
                "dormant": Field((max(1, len(self.layers)),)), "weight_norm": Field((len(self.linear_layers),)),
                "ntk_effective_rank": Field(()), "ntk_numerical_rank": Field(()), "ntk_condition_nonzero": Field(())}

    def compute(self, ctx: ProbeContext) -> dict[str, np.ndarray]:
        captured = self._capture(ctx)
        modules = dict(ctx.model.named_modules())
        features = captured[self.linear_layers[-1]][0]
        dormant = [float(dormant_units(captured[n][1], self.tau).double().mean()) for n in self.layers] or [np.nan]
        kernel = interference.ntk(_model_fn(ctx), ctx.inputs, output="trace")
        return {"effective_rank": np.float32(effective_rank(features)),
                "srank": np.float32(srank(features, self.delta)),
                "feature_norm": np.float32(feature_norm(features)),
                "dormant": np.asarray(dormant, dtype=np.float32),
                "weight_norm": np.asarray([_weight(modules[n]).norm().item() for n in self.linear_layers],
                                          dtype=np.float32),
                "ntk_effective_rank": np.float32(kernel_effective_rank(kernel)),
                "ntk_numerical_rank": np.float32(numerical_rank(kernel)),
                "ntk_condition_nonzero": np.float32(np.log10(nonzero_condition_number(kernel)))}


def _weight(m: nn.Module) -> Tensor:
    """A linear layer's weight (a noisy layer's mean weight)."""
    return m.weight_mu if isinstance(m, NoisyLinear) else m.weight


PROBES: dict[str, type[Probe]] = {p.name: p for p in (GradCovProbe, NTKProbe, OutputsProbe, SparsityProbe, WeightsProbe,
                                                      PlasticityProbe)}


def register_probe(cls: type[Probe], *, replace: bool = False) -> type[Probe]:
    """Make probe class ``cls`` available by its ``name`` to every CLI (``--probe NAME``); usable as a class
    decorator in a plugin module. ``cls`` should declare a :class:`~runlog.ProbeSchema` for reports."""
    if not (isinstance(cls, type) and issubclass(cls, Probe)) or cls.name == Probe.name:
        raise ValueError(f"register_probe takes a Probe subclass with its own name, got {cls!r}")
    if cls.name in PROBES and PROBES[cls.name] is not cls and not replace:
        raise ValueError(f"probe {cls.name!r} is registered already (pass replace=True to redefine it)")
    PROBES[cls.name] = cls
    return cls


def make_probe(name: str, **kwargs: Any) -> Probe:
    """Build a registered probe by name (built-in: ``gradcov``, ``ntk``, ``outputs``, ``sparsity``, ``weights``,
    ``plasticity``)."""
    if name not in PROBES:
        raise ValueError(f"unknown probe {name!r}; choose from {', '.join(sorted(PROBES))}")
    return PROBES[name](**kwargs)
