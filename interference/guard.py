"""What every engine call guarantees about the model it measures, and the state it runs the model in.

:func:`engine_call` wraps each public entry point (:func:`interference.ntk`, :func:`interference.explain`,
:func:`interference.gradient_covariance`, :func:`interference.per_sample_grads`,
:func:`interference.squared_grad_sum`). On exit, whatever happened inside (an error included), the model has the
same parameter and buffer objects under every name (so ``.grad``, ``requires_grad`` and the optimizer's references
are untouched), the same training flags, and its parameters' tensor hooks. Inside:

* tensor hooks on the parameters (``weight.register_hook(...)``) are set aside: they change the gradient an
  optimizer receives, not the model's function, and the kernel is of the function (every implementation ignores
  them alike);
* ``torch.nn.utils.parametrize.cached()`` is suspended (its cached weights carry one graph that the engine's many
  forwards cannot share) and the fused ``nn.MultiheadAttention`` / ``TransformerEncoder`` inference path is off
  (it takes another kernel with or without gradients, so runs of one sample and of a batch would round apart);
* the inputs are detached copies, so a forward that modifies its input in place leaves the caller's untouched, and
  the kernel carries no graph.

Forwards that change the model's buffers (counters, running statistics) or draw random numbers are refused by the
planning runs (:mod:`interference.plan`), which restore the buffers they saw change; a buffer changed in place by a
later call (whose plan was cached) is reported when the call ends, and cannot be undone then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize
from torch.utils import _pytree as pytree

__all__ = ["engine_call", "detached", "BufferWatch", "rng_states", "refuse_random"]

Batch = Any


@contextlib.contextmanager
def engine_call(model: nn.Module) -> Iterator[None]:
    """Run the engine on ``model`` and leave it as it was (see the module docstring)."""
    saved = [(mod, dict(mod._parameters), dict(mod._buffers), mod.training) for mod in model.modules()]
    versions = [(buf, buf._version) for _, _, buffers, _ in saved for buf in buffers.values() if buf is not None]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    hooks = [(p, dict(p._backward_hooks)) for p in model.parameters() if getattr(p, "_backward_hooks", None)]
    for p, _ in hooks:
        p._backward_hooks.clear()
    cache = parametrize._cache_enabled
    fastpath = torch.backends.mha.get_fastpath_enabled()
    parametrize._cache_enabled = 0
    torch.backends.mha.set_fastpath_enabled(False)
    failed = True
    try:
        yield
        failed = False
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
        parametrize._cache_enabled = cache
        for p, own in hooks:
            p._backward_hooks.update(own)
        for p, flag in flags:
            if p.requires_grad != flag:
                p.requires_grad_(flag)
        for mod, params, buffers, training in saved:
            for store, own in ((mod._parameters, params), (mod._buffers, buffers)):
                for name, value in own.items():
                    if store.get(name) is not value or name in mod.__dict__:
                        mod.__dict__.pop(name, None)
                        store[name] = value
            mod.training = training
    if not failed and any(buf._version != version for buf, version in versions):
        raise ValueError("the model's forward changed a buffer in place during this call, although it did not in the"
                         " calls that made the plan; the change could not be undone. Make the forward leave its"
                         " buffers alone for the measurement")


def detached(batch: Batch | None) -> Batch | None:
    """Detached copies of a batch's tensors (``None`` stays ``None``)."""
    if batch is None:
        return None
    return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, Tensor) else t, batch)


class BufferWatch:
    """The model's buffers before a planning run, to tell which ones a forward changed and put them back."""

    def __init__(self, model: nn.Module) -> None:
        self.entries = [(mod, name, buf, buf._version, buf.detach().clone())
                        for mod_name, mod in model.named_modules() for name, buf in mod._buffers.items()
                        if buf is not None]
        self.names = {(id(mod), name): f"{mod_name}.{name}" if mod_name else name
                      for mod_name, mod in model.named_modules() for name in mod._buffers}

    def changed(self) -> list[str]:
        """Names of the buffers that were replaced or modified in place since the watch began."""
        return [self.names[(id(mod), name)] for mod, name, buf, version, _ in self.entries
                if mod._buffers.get(name) is not buf or buf._version != version]

    def restore(self) -> None:
        """Put every buffer object back, holding its value from before."""
        for mod, name, buf, version, value in self.entries:
            if mod._buffers.get(name) is not buf:
                mod._buffers[name] = buf
            if buf._version != version:
                with torch.no_grad():
                    buf.copy_(value)

    def refuse_if_changed(self) -> None:
        """Raise the engine's error for stateful forwards (after restoring the buffers) if any buffer changed."""
        names = self.changed()
        if names:
            self.restore()
            raise ValueError(f"the model's forward changes its buffers {names} (a counter or running statistics"
                             " updated per call), so each of the engine's runs would see another model; make the"
                             " forward leave them alone for the measurement (e.g. model.eval(), or freeze the"
                             " update), then call again")


def rng_states() -> list[Tensor]:
    """The global random number generators' states (CPU and every initialised CUDA device)."""
    states = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += list(torch.cuda.get_rng_state_all())
    return states


def refuse_random(before: list[Tensor]) -> None:
    """Raise the engine's error for random forwards if a global generator moved since ``before``."""
    after = rng_states()
    if len(after) != len(before) or any(not torch.equal(a, b) for a, b in zip(after, before)):
        raise_random()


def raise_random() -> None:
    raise ValueError("the model's forward draws random numbers (dropout in training mode, F.dropout(...,"
                     " training=True), torch.randn_like noise, a generator of its own), so its per-sample Jacobians"
                     " are random; call model.eval() or make the forward deterministic for the measurement")
