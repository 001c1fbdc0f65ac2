"""Plans are made once per model structure and reused: the proofs of :mod:`interference.plan` are the slow part of a
call, and they depend on nothing that a later call with the same key could change.

The key holds everything a plan's proofs rest on: the function (the model's outputs, or a loss function by
identity), the implementation, the selected parameter names, and for every module its identity, type, class and
instance ``forward``, training flag, forward/backward (pre-)hooks, children and its parameters' and buffers'
identities and ``requires_grad`` flags (parametrizations change the module's class and children), the global module
hooks, the registered layer rules, and each input leaf's per-sample shape, dtype and device. A change to any of them
is a new key, so a new plan. What a plan cannot prove for a batch it was not made on, every call checks on its own
batch (:mod:`interference.rows`).

Plans are kept per model (at most 8, the most recently used) and dropped with the model.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Any

from torch import Tensor, nn
from torch.nn.modules import module as _module
from torch.utils import _pytree as pytree

from . import rules
from .plan import Plan

__all__ = ["plan_key", "lookup", "store", "forget"]

_PER_MODEL = 8
_PLANS: "weakref.WeakKeyDictionary[nn.Module, OrderedDict[Hashable, Plan]]" = weakref.WeakKeyDictionary()


def _inputs(batch: Any) -> Hashable:
    if batch is None:
        return None
    leaves, spec = pytree.tree_flatten(batch)
    return repr(spec), tuple((tuple(t.shape[1:]), t.dtype, t.device) if isinstance(t, Tensor) else type(t)
                             for t in leaves)


def _module_key(m: nn.Module) -> Hashable:
    return (id(m), type(m), type(m).forward, m.__dict__.get("forward"), m.training, tuple(m._forward_hooks),
            tuple(m._forward_pre_hooks), tuple(m._backward_hooks), tuple(m._backward_pre_hooks),
            tuple((k, id(c)) for k, c in m._modules.items()),
            tuple((k, id(p), p.requires_grad) for k, p in m._parameters.items() if p is not None),
            tuple((k, id(b)) for k, b in m._buffers.items() if b is not None))


def plan_key(model: nn.Module, fn_key: Hashable, params: Iterable[str] | None, batch: Any, batch2: Any,
             implementation: str) -> Hashable | None:
    """The key of a plan for these arguments (see the module docstring); ``None`` if one cannot be made."""
    try:
        return (fn_key, implementation, None if params is None else tuple([params] if isinstance(params, str)
                                                                           else params),
                tuple(_module_key(m) for m in model.modules()), _inputs(batch), _inputs(batch2),
                tuple(tuple(getattr(_module, a, {})) for a in ("_global_forward_pre_hooks", "_global_forward_hooks",
                                                              "_global_backward_pre_hooks",
                                                              "_global_backward_hooks")),
                tuple(rules._RULES.items()))
    except TypeError:  # something unhashable: no caching
        return None


def lookup(model: nn.Module, key: Hashable | None) -> Plan | None:
    """The plan stored under ``key`` for ``model``, or ``None``."""
    plans = _PLANS.get(model)
    if key is None or plans is None or key not in plans:
        return None
    plans.move_to_end(key)
    return plans[key]


def store(model: nn.Module, key: Hashable | None, plan: Plan) -> None:
    """Keep ``plan`` for later calls with ``key``, when it may serve them (made on two distinct samples, and not
    holding the model itself, which would keep it alive)."""
    if key is None or not plan.cacheable or model in plan.modules:
        return
    plans = _PLANS.setdefault(model, OrderedDict())
    plans[key] = plan
    plans.move_to_end(key)
    while len(plans) > _PER_MODEL:
        plans.popitem(last=False)


def forget(model: nn.Module, key: Hashable | None) -> None:
    """Drop the plan stored under ``key`` (a cached plan whose checks failed on a new batch is made again)."""
    plans = _PLANS.get(model)
    if plans is not None and key is not None:
        plans.pop(key, None)
