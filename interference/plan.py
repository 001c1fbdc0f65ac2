"""Which path each parameter takes, and the proof behind every layer-wise claim.

A layer-wise rule (:mod:`interference.rules`) claims a parameter only when all of these hold; each failure is a
reason the parameter goes to the exact path instead:

* structure: the module's type is exactly the rule's type, with no forward/backward (pre-)hooks (old-style
  ``weight_norm`` / ``spectral_norm`` are pre-hooks), no parametrization, no ``forward`` set on the instance and
  nothing the rule itself refuses (e.g. grouped convolutions); no global module hooks; the parameter belongs to
  this one module and is one the rule differentiates;
* one call: the module runs exactly once per forward, with one tensor argument (positional or keyword);
* rows are the samples: two dry runs on single samples ``s0``, ``s1`` and two on the pairs ``[s0, s1]`` and
  ``[s1, s0]`` reproduce the single runs' module inputs and model outputs row by row (this catches time-major
  layouts, ``reshape(N*T, F)``, ``x.flip(0)``, ``x - x.mean(0)`` and anything else that mixes or permutes rows);
  and the gradient of output row ``i`` reaches row ``i`` of the module's output only (nothing downstream mixes
  samples);
* no other use: in the autograd graph of a dry run, the parameter is reachable from the output only through the
  module's own call, and that call reaches no other module's parameter (observed on the graph itself, so ties such
  as ``F.embedding(ids, head.weight)``, a use in the loss, a weight read by another layer or a view of the weight
  made in ``__init__`` are all seen);
* the rule's own checks: the class's ``forward`` is still the one the rule was registered for, and the input has a
  shape the rule handles (e.g. 4-D for ``Conv2d``).

``s1`` is the sample that differs from ``s0`` in the most batch entries (bitwise, so ``-0.0`` differs from ``0.0``),
then by the largest distance. Values are compared with a tolerance of ``sqrt(eps)`` of the least precise floating
dtype among the model's tensors and the inputs (a batch of 2 may round differently from a batch of 1); mixing
smaller than that goes unnoticed here; model outputs (where a loss may follow a cancellation, as a squared TD error
does) and the block checks below use ``min(16 sqrt(eps), 0.05)`` relative to the block's largest output. Graph
nodes present in two dry runs' graphs were made outside ``forward`` (a view of a weight taken in ``__init__``):
``functional_call`` cannot see such uses, so their parameters' exact path is the loop. If every sample equals every other there is no pair to compare: the engine then computes the kernel of
one sample and repeats it, which is exact. The dry runs call ``forward`` four or five times on one or two samples,
so state a forward changes (running statistics in training mode, counters) sees those calls.

Dry runs cannot see what only other samples would show (a branch on a value only a later sample has, a batch-size
test); every block the engine computes is checked on every row as well (:mod:`interference.rows`), and a block that
fails sends every parameter to the exact path.

The dry runs, value comparisons and graph walks these proofs rest on are in :mod:`interference._plan_evidence`; this
module decides the paths from them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module
from torch.nn.utils import parametrize
from torch.utils import _pytree as pytree

from ._plan_evidence import (_cat, _check_gradient_rows, _leaves_below, _refuse_reentrant_checkpoint, _rows_ok, _run,
                             check_pure, close, distinct_sample, hidden_uses, raise_reentrant, tolerance,
                             unseen_message, unseen_parameters, use_counts)
from .exact import exact_path_check
from .guard import BufferWatch, raise_random, refuse_random, rng_states
from .rules import LayerRule, registered_rules, rule_for

__all__ = ["ParamPath", "Plan", "make_plan", "close", "distinct_sample", "hidden_uses", "tolerance", "unseen_parameters",
           "unseen_message", "raise_reentrant", "check_pure", "use_counts"]

Batch = Any

SMALL_JACOBIAN = 4096
"""Entries (outputs x selected parameters) of one sample's Jacobian at or below which ``auto`` runs every parameter
on ``func`` when ``func`` is proven for all (``ntk`` and ``gradient_covariance``; 0 turns it off)."""


@dataclass(frozen=True)
class ParamPath:
    """The path one parameter takes: ``"rule"`` (layer-wise, ``rule`` names the module type), ``"func"``
    (``torch.func`` ``vmap(jacrev)``) or ``"loop"`` (per-sample autograd); ``reason`` says why."""

    name: str
    path: str
    rule: str | None
    reason: str


@dataclass(eq=False)
class Plan:
    """Per-parameter paths (``paths``) and what the engine runs: ``modules`` (module -> local names on its rule),
    ``exact`` (full names on the exact path, computed by ``exact_impl``)."""

    paths: dict[str, ParamPath] = field(default_factory=dict)
    modules: dict[nn.Module, frozenset[str]] = field(default_factory=dict)
    exact: list[str] = field(default_factory=list)
    exact_impl: str = "func"
    identical_samples: bool = False
    outputs: int = 0
    io: dict[nn.Module, int] = field(default_factory=dict)  # elements of one sample's input + output per module
    fallback: str | None = None  # why vmap cannot be used: auto takes the loop, func raises
    implementation: str = "auto"
    tolerance: float = 0.0  # relative tolerance of value comparisons (sqrt(eps) of the least precise dtype)
    check_tolerance: float = 0.0  # the same for model outputs and block checks: min(16 tolerance, 0.05)
    selected: dict[str, nn.Parameter] = field(default_factory=dict)
    dtype: torch.dtype = torch.float32  # the kernel's: the selected parameters'
    reference: str = "vmap"  # how the every-row check runs samples alone: "vmap", or "loop" once vmap failed
    cacheable: bool = True  # made on two distinct samples (identical samples prove no rows): may serve later calls
    uses: dict[int, int] = field(default_factory=dict)  # id of each parameter on a rule -> its uses in the graph

    def __str__(self) -> str:
        rows = [(p.name, f"rule:{p.rule}" if p.path == "rule" else p.path, p.reason) for p in self.paths.values()]
        w1 = max(len(r[0]) for r in [("parameter",)] + rows)
        w2 = max(len(r[1]) for r in [("", "path")] + rows)
        return "\n".join(f"{a:<{w1}}  {b:<{w2}}  {c}" for a, b, c in [("parameter", "path", "reason")] + rows)


# ----------------------------------------------------------------------------------------------- structure
_HOOKS = (("_forward_pre_hooks", "forward pre-hooks"), ("_forward_hooks", "forward hooks"),
          ("_backward_pre_hooks", "backward pre-hooks"), ("_backward_hooks", "backward hooks"))


def _hook_names(hooks: dict) -> str:
    names = sorted({getattr(h, "__qualname__", None) or type(h).__name__ for h in hooks.values()})
    return ", ".join(names)


def _global_hooks() -> str | None:
    found = [what for attr, what in (("_global_forward_pre_hooks", "forward pre-hooks"),
                                     ("_global_forward_hooks", "forward hooks"),
                                     ("_global_backward_pre_hooks", "backward pre-hooks"),
                                     ("_global_backward_hooks", "backward hooks")) if getattr(_module, attr, None)]
    return f"global module {' and '.join(found)} are registered" if found else None


def _module_refusal(mod: nn.Module) -> tuple[LayerRule | None, str | None]:
    """The rule for ``mod`` and ``None``, or ``None`` and why no rule may claim its parameters."""
    rule = rule_for(mod)
    if rule is None:
        if parametrize.is_parametrized(mod):
            return None, f"{type(mod).__name__} is parametrized (torch.nn.utils.parametrize)"
        bases = [t.__name__ for t in registered_rules() if isinstance(mod, t)]
        if bases:
            return None, f"{type(mod).__name__} subclasses {bases[0]}; rules cover exact types only"
        return None, f"no layer-wise rule for {type(mod).__name__}"
    for attr, what in _HOOKS:
        hooks = getattr(mod, attr, None)
        if hooks:
            return None, f"{type(mod).__name__} has {what} ({_hook_names(hooks)})"
    if "forward" in vars(mod):
        return None, f"{type(mod).__name__}.forward is replaced on the instance"
    if type(mod).forward is not rule.forward:
        return None, f"{type(mod).__name__}.forward was replaced on the class after its rule was registered"
    reason = rule.refuse(mod) if rule.refuse is not None else None
    if reason:
        return None, f"{type(mod).__name__}: {reason}"
    return rule, None


# ----------------------------------------------------------------------------------------------- the plan
def make_plan(fn: Callable[[Batch], Tensor], model: nn.Module, selected: dict[str, nn.Parameter], batch: Batch,
              batch2: Batch | None, implementation: str, rules: bool = True, small: bool = False) -> Plan:
    """Decide and justify the path of every selected parameter (see the module docstring); ``rules=False`` puts
    every parameter on the exact path (the engine's answer to a block that failed its checks); ``small=True``: under
    ``auto``, a model whose one-sample Jacobian has at most :data:`SMALL_JACOBIAN` entries runs every parameter on
    ``func`` where ``func`` is proven for all of them (cheaper than the layer-wise pass and its check).

    Refuses (ValueError) a forward that changes the model's buffers or draws random numbers, after putting the
    buffers back; a forward checkpointed with ``use_reentrant=True`` (RuntimeError)."""
    watch, rng = BufferWatch(model), rng_states()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            plan = _decide(fn, model, selected, batch, batch2, implementation, rules, small)
        except BaseException:
            watch.refuse_if_changed()  # a stateful forward often fails in vmap or in the comparisons first
            watch.restore()
            raise
        finally:
            if any("None of the inputs have requires_grad=True" in str(w.message) for w in caught):
                watch.restore()
                raise_reentrant()  # checkpoint(use_reentrant=True) on inputs without grad: no gradients at all
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    watch.refuse_if_changed()
    refuse_random(rng)
    return plan


def _decide(fn: Callable[[Batch], Tensor], model: nn.Module, selected: dict[str, nn.Parameter], batch: Batch,
            batch2: Batch | None, implementation: str, rules: bool, small: bool) -> Plan:
    plan = Plan(implementation=implementation)
    one = pytree.tree_map(lambda t: t[:1], batch)
    found = distinct_sample(batch, batch2)
    other = None if found is None else found[0]
    plan.identical_samples = other is None
    plan.cacheable = other is not None
    tol = tolerance(model, batch)
    out_tol = min(16 * tol, 0.05)  # model outputs: a loss after cancellation rounds differently in a pair
    exact_reason = {"func": "implementation='func'", "loop": "implementation='loop'"}.get(implementation)
    if not rules:
        exact_reason = "a block failed the per-sample checks"

    # structure: which modules may use a rule, and for which of their parameters
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for mod in model.modules():
        for local, p in mod.named_parameters(recurse=False):
            owners.setdefault(id(p), []).append((mod, local))
    why: dict[str, str] = {}
    claims: dict[nn.Module, set[str]] = {}
    blocked = _global_hooks()
    for name, p in selected.items():
        if exact_reason:
            why[name] = exact_reason
            continue
        mods = owners.get(id(p), [])
        if len(mods) != 1:
            why[name] = f"shared by {len(mods)} modules" if mods else "not a module parameter"
            continue
        mod, local = mods[0]
        rule, refusal = _module_refusal(mod)
        if blocked or refusal:
            why[name] = blocked or refusal
        elif local not in rule.params:
            why[name] = f"{type(mod).__name__}'s rule does not differentiate {local!r}"
        else:
            claims.setdefault(mod, set()).add(local)
    full_name = {(id(mod), local): name for name, p in selected.items() for mod, local in owners.get(id(p), [])[:1]}

    def refuse(mod: nn.Module, reason: str) -> None:
        for local in claims.pop(mod, ()):
            why[full_name[(id(mod), local)]] = reason

    # s0 alone, twice with grad (selected parameters switched on): calls, shapes, the graph, determinism
    frozen = [p for p in selected.values() if not p.requires_grad]
    for p in frozen:
        p.requires_grad_(True)
    try:
        mods = list(claims)
        probes_a: dict[nn.Module, list[Tensor]] = {}
        out_a, calls_a = _run(fn, one, mods, grad=True, probes=probes_a)
        plan.outputs = out_a.shape[1]
        cuts = {}
        for mod in mods:
            c = calls_a[mod]
            reason = rule_for(mod).refuse_input(mod, c[0].inp) if len(c) == 1 and c[0].inp is not None else None
            if len(c) != 1:
                refuse(mod, f"called {len(c)} times per forward" if c else "not called by the forward")
            elif c[0].inp is None or c[0].out is None:
                refuse(mod, "not called with exactly one tensor argument and one tensor output")
            elif c[0].inp.dim() == 0 or c[0].inp.shape[0] != 1 or c[0].out.dim() == 0 or c[0].out.shape[0] != 1:
                refuse(mod, f"its input's leading dimension is not the samples (shape {tuple(c[0].inp.shape)}"
                            " for one sample)")
            elif reason:
                refuse(mod, f"{type(mod).__name__}: {reason}")
            elif c[0].out_node is not None:
                cuts[c[0].out_node] = (mod, [c[0].inp_node] if c[0].inp_node is not None else [])
        own = {m: {id(q) for q in m.parameters(recurse=False)} for m in mods}
        reached = _leaves_below([out_a.grad_fn], cuts, own)
        probes: dict[nn.Module, list[Tensor]] = {}
        mods = list(claims)
        if other is not None:  # the pair, with probes for the gradient rows; its graph is the second one
            out_ab, calls_ab = _run(fn, _cat(one, other), mods, grad=True, probes=probes)
        else:
            out_ab, _ = _run(fn, one, [], grad=True)
        if not close(out_ab if other is None else _run(fn, one, [], grad=False)[0], out_a, out_tol):
            raise_random()  # the same sample twice, another output (a generator of the model's own)
        hidden = hidden_uses(out_a, out_ab)
        _refuse_reentrant_checkpoint(out_a)
    finally:
        for p in frozen:
            p.requires_grad_(False)
    for mod in list(claims):
        for local in list(claims[mod]):
            if id(getattr(mod, local)) in reached:
                why[full_name[(id(mod), local)]] = "also used outside its module's call (tied or reused tensor)"
                claims[mod].discard(local)
        if not claims[mod]:
            claims.pop(mod)

    # rows are the samples: s1 alone and [s1, s0] against the pair [s0, s1]
    if other is not None and claims:
        mods = list(claims)
        with torch.no_grad():
            out_b, calls_b = _run(fn, other, mods, grad=False)
            out_ba, calls_ba = _run(fn, _cat(other, one), mods, grad=False)
        outputs_ok = _rows_ok(out_ab, out_a, out_b, out_tol) and _rows_ok(out_ba, out_b, out_a, out_tol)
        for mod in mods:
            if not outputs_ok:
                refuse(mod, "the model's outputs for two samples together differ from each sample's alone")
                continue
            cs = [calls_a[mod], calls_b[mod], calls_ab[mod], calls_ba[mod]]
            if any(len(c) != 1 for c in cs):
                refuse(mod, "called a different number of times for other samples")
            elif not (_rows_ok(cs[2][0].inp, cs[0][0].inp, cs[1][0].inp, tol)
                      and _rows_ok(cs[3][0].inp, cs[1][0].inp, cs[0][0].inp, tol)
                      and _rows_ok(cs[2][0].out, cs[0][0].out, cs[1][0].out, tol)):
                refuse(mod, "its input rows are not the samples (two samples together differ from each alone)")
        if claims:
            _check_gradient_rows(out_ab, {m: probes[m][0] for m in claims if m in probes}, refuse, tol)

    plan.tolerance, plan.check_tolerance = tol, out_tol
    plan.modules = {m: frozenset(u) for m, u in claims.items()}
    plan.uses = use_counts(out_a.grad_fn, {id(getattr(m, local)) for m, u in claims.items() for local in u})
    plan.io = {m: calls_a[m][0].inp.numel() + calls_a[m][0].out.numel() for m in claims}
    rule_of = {full_name[(id(m), local)]: type(m).__name__ for m, u in claims.items() for local in u}
    plan.exact_impl = "loop" if implementation == "loop" else "func"
    size = plan.outputs * sum(p.numel() for p in selected.values())
    if small and rule_of and implementation == "auto" and size <= SMALL_JACOBIAN \
            and not hidden & {id(p) for p in selected.values()} \
            and exact_path_check(fn, model, list(selected), one if other is None else _cat(one, other),
                                 lambda a, b: close(a, b, tol)) is None:
        why.update(dict.fromkeys(rule_of, f"small model: one sample's Jacobian has {size} <= {SMALL_JACOBIAN}"
                                          " entries, where vmap(jacrev) is cheaper than the layer-wise pass"))
        rule_of, plan.modules, plan.io, plan.uses = {}, {}, {}, {}
    exact = [k for k in selected if k not in rule_of]
    if exact and implementation in ("auto", "func"):  # vmap must see every use, run the model and agree with autograd
        unseen = [k for k in exact if id(selected[k]) in hidden]
        plan.fallback = unseen_message(unseen) if unseen else \
            exact_path_check(fn, model, exact, one if other is None else _cat(one, other),
                             lambda a, b: close(a, b, tol))
        if plan.fallback and implementation == "auto":
            plan.exact_impl = "loop"
    for name in selected:
        if name in rule_of:
            plan.paths[name] = ParamPath(name, "rule", rule_of[name], f"{rule_of[name]} rule")
        else:
            plan.exact.append(name)
            reason = why.get(name, "not reached by a rule") + (f"; {plan.fallback}" if plan.fallback else "")
            plan.paths[name] = ParamPath(name, plan.exact_impl, None, reason)
    return plan
