"""The members' networks, stacked on a leading member axis: the Q-network a member starts from
(:func:`member_q_net`), the ways one call runs every member's network (:data:`IMPLEMENTATIONS`; batched ops for
the MLPs :func:`_batched_forward` knows), the members' TD losses and the RMSprop step on the stacked parameters."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from stable_baselines3.common.utils import set_random_seed
from torch import Tensor, nn
from torch.nn import functional as F

from agents.rl.algos import ALGOS
from agents.rl.envs import env_spaces
from interference import FTA, LWTA, Elephant, Maxout, elephant

#: how the members' networks run, fastest first: "compiled" (the batched network, TD loss and RMSprop step through
#: ``torch.compile``: one fused kernel where eager runs a dozen elementwise passes; costs a compile per population and
#: process, and a C++ compiler), "batched" (batched matmuls with the fused Elephant kernel, eager), both for MLPs of the
#: layers :func:`_batched_forward` knows and refused for other networks; "vmap" (one batched call of any module through
#: torch.func, whose Elephant runs as plain ops); "loop" (one call per member: the very kernels SB3's DQN runs, bit for
#: bit its updates; the slow twin of all three); "auto" ("compiled" for runs of at least :data:`COMPILE_FROM`
#: agent-steps, where the faster updates repay the compile, else "batched"; "batched" for networks with an LWTA layer
#: that :func:`_slab_form` leaves out; "vmap" for networks the batched path does not know). The implementations agree to
#: float rounding, which RL amplifies over a run: under "auto" a member's exact numbers depend on how many members share
#: its population (in a grid, on ``population_size`` and what is left to run); name one (``implementation=`` of
#: :func:`agents.population.run.run_population`) where runs must repeat bit for bit across groupings
IMPLEMENTATIONS = ("auto", "compiled", "batched", "vmap", "loop")
#: members x env steps from which "auto" compiles
COMPILE_FROM = 500_000
#: Linear layers with at most this many outputs run under "compiled" as one product-sum per output, unless they
#: follow a layer of :data:`MATMUL_AFTER`: Inductor fuses the sums into one loop that computes the layer before once
NARROW = 16
#: under "compiled", a Maxout or LWTA layer after a Linear layer of at most this many inputs takes its input slab by
#: slab (:func:`_slab_form`)
SLAB_INPUTS = 64
#: layers after which a narrow Linear stays a matmul under "compiled": fusing the product-sum with their wide outputs
#: is slower than the matmul
MATMUL_AFTER = (LWTA, FTA)


def _batched_forward(base: nn.Module, compiled: bool) -> Callable[[Mapping[str, Tensor], Tensor], Tensor] | None:
    """``forward(stacked params, x (P, B, D)) -> (P, B, out)`` for an MLP of the layers it knows (Linear, LayerNorm,
    ReLU, per-unit learnable Elephant; Maxout, LWTA and FTA, which have no parameters and act on the last dimension,
    run as themselves or, compiled, Maxout and LWTA in :func:`_slab_form`), as batched ops; None for any other module
    (it then runs through ``vmap``). ``compiled``: the form ``torch.compile`` fuses best (the Elephant formula in
    plain ops; a narrow Linear layer, such as the Q head, as one product-sum over its inputs per output, which
    Inductor fuses with the activation before it, where a matmul of a few columns is a slow call); else eager
    kernels (baddbmm, the fused Elephant function)."""
    if not isinstance(base, nn.Sequential):
        return None
    steps: list[Callable[[Mapping[str, Tensor], Tensor], Tensor]] = []
    previous: nn.Module | None = None
    previous_name = ""
    children = list(base.named_children())
    # > 1: the slab order (of this group size) of the next Linear layer's input (slabs) and of the last one's
    slabs = linear_input = 1
    for i, (name, mod) in enumerate(children):
        fuse = compiled and type(previous) not in MATMUL_AFTER
        if compiled and _slab_form(children, i):
            steps[-1] = lambda p, x, n=previous_name, k=mod.k, order=linear_input: _slab_linear(
                _slab_columns(p[f"{n}.weight"], order), p[f"{n}.bias"], x, k)
            group = _slab_max if type(mod) is Maxout else _slab_lwta
            steps.append(lambda p, x, k=mod.k, group=group: group(x, k))
            slabs = mod.k if type(mod) is LWTA else 1
            previous, previous_name = mod, name
            continue
        previous, previous_name = mod, name
        if type(mod) is nn.Linear:  # the order its input comes in (kept should the next layer take the slab form)
            linear_input, slabs = slabs, 1
        if type(mod) is nn.Linear and mod.bias is not None and fuse and linear_input == 1 and \
                mod.out_features <= NARROW:
            steps.append(lambda p, x, n=name, out=mod.out_features: torch.stack(
                [(x * p[f"{n}.weight"][:, None, o]).sum(-1) for o in range(out)], -1) + p[f"{n}.bias"][:, None, :])
        elif type(mod) is nn.Linear and mod.bias is not None and linear_input > 1:
            steps.append(lambda p, x, n=name, k=linear_input: torch.baddbmm(
                p[f"{n}.bias"][:, None, :], x, _slab_columns(p[f"{n}.weight"], k).transpose(1, 2)))
        elif type(mod) is nn.Linear and mod.bias is not None:
            steps.append(lambda p, x, n=name: torch.baddbmm(p[f"{n}.bias"][:, None, :], x,
                                                            p[f"{n}.weight"].transpose(1, 2)))
        elif type(mod) is nn.LayerNorm and mod.elementwise_affine and mod.bias is not None and \
                len(mod.normalized_shape) == 1:
            steps.append(lambda p, x, n=name, eps=mod.eps: torch.addcmul(
                p[f"{n}.bias"][:, None, :], F.layer_norm(x, x.shape[-1:], eps=eps), p[f"{n}.weight"][:, None, :]))
        elif type(mod) is nn.ReLU:
            steps.append(lambda p, x: torch.relu(x))
        elif type(mod) in (Maxout, LWTA, FTA):  # no parameters, the last dimension only: the module itself
            steps.append(lambda p, x, mod=mod: mod(x))
        elif type(mod) is Elephant and mod.num_units is not None and mod.learnable:
            steps.append(lambda p, x, n=name, d=mod.d, k="autograd" if compiled else "fused": elephant(
                x, p[f"{n}.log_h"].exp()[:, None, :], p[f"{n}.log_a"].exp()[:, None, :], d, k))
        else:
            return None

    def forward(params: Mapping[str, Tensor], x: Tensor) -> Tensor:
        for step in steps:
            x = step(params, x)
        return x

    return forward


def _slab_form(children: Sequence[tuple[str, nn.Module]], i: int) -> bool:
    """Whether layer ``i`` of an MLP's ``(name, module)`` list runs in slab form under "compiled": a Maxout or LWTA
    layer of ``k`` units per group after a Linear layer with a bias, at most :data:`SLAB_INPUTS` inputs and a
    multiple of ``k`` outputs; an LWTA layer also before a Linear layer with a bias and at most :data:`SLAB_INPUTS`
    outputs (the weights permuted per call: ``out x in`` copies per member, cheap against ``batch x out``
    activations when ``out`` is small). The Linear before it then computes its units slab by slab (unit ``j`` of
    every group first, :func:`_slab_linear`), so that the group max is a reduction over a strided dimension, which
    Inductor vectorises along the slabs; LWTA's output stays in slab order and the Linear after it takes its
    weight's columns in that order (:func:`_slab_columns`). Elsewhere the module runs as itself."""
    mod = children[i][1]
    if type(mod) not in (Maxout, LWTA) or i == 0:
        return False
    before = children[i - 1][1]
    if not (type(before) is nn.Linear and before.bias is not None and before.in_features <= SLAB_INPUTS and
            before.out_features % mod.k == 0):
        return False
    after = children[i + 1][1] if i + 1 < len(children) else None
    return type(mod) is Maxout or (type(after) is nn.Linear and after.bias is not None and
                                   after.out_features <= SLAB_INPUTS)


def eager_faster(base: nn.Module) -> bool:
    """Whether "auto" runs ``base`` eagerly at any size: an LWTA layer out of slab form (Inductor's CPU code for its
    group max over adjacent units is slower than eager's)."""
    children = list(base.named_children())
    return any(type(mod) is LWTA and not _slab_form(children, i) for i, (_, mod) in enumerate(children))


def _slab_linear(weight: Tensor, bias: Tensor, x: Tensor, k: int) -> Tensor:
    """``x @ weight.T + bias`` ``(P, B, out)`` with its units reordered into ``k`` slabs: unit ``g * k + j`` (unit
    ``j`` of group ``g``) at ``j * (out / k) + g``."""
    P, out, inputs = weight.shape
    w = weight.unflatten(1, (out // k, k)).transpose(1, 2).reshape(P, out, inputs)
    b = bias.unflatten(1, (out // k, k)).transpose(1, 2).reshape(P, out)
    return torch.baddbmm(b[:, None, :], x, w.transpose(1, 2))


def _slab_max(x: Tensor, k: int) -> Tensor:
    """Maxout of :func:`_slab_linear`'s output: the max over its ``k`` slabs ``(P, B, out / k)``, its gradient split
    evenly among ties (as Maxout's). Where autograd records it outside ``torch.func``, written as the max plus a term
    that is 0 but carries that gradient, with the winners' mask ``1 + sign(x - max)`` as a float: Inductor's CPU code
    keeps ``amax``'s bool mask for the backward and stores it several times slower than the float (under
    ``torch.func.grad`` the forward and backward compile as one graph and ``amax`` is the faster). In that form an
    infinite input gives nan (``inf - inf``) where ``amax`` gives inf or, for an infinite loser, the finite max: the
    member's loss is then not finite, and it stops as diverged where the module's run might go on."""
    slabs = x.unflatten(-1, (k, -1))
    if not torch.is_grad_enabled() or torch._C._are_functorch_transforms_active():  # (as interference.elephant)
        return slabs.amax(-2)
    top = slabs.detach().amax(-2, keepdim=True)
    share = 1 + torch.sign(slabs.detach() - top)
    return top[..., 0, :] + ((slabs - slabs.detach()) * (share / share.sum(-2, keepdim=True))).sum(-2)


def _slab_lwta(x: Tensor, k: int) -> Tensor:
    """LWTA of :func:`_slab_linear`'s output ``(P, B, out)``, in its slab order: each unit where it is the largest
    of its group (ties pass together), else 0. The winners' mask is ``1 + sign(x - max)`` (1 where ``x`` is the max,
    else 0), a float computed without a bool: Inductor's CPU code keeps a comparison's bool mask for the backward
    and stores it several times slower than the float. (``sign(nan)`` is 0 in ATen and Inductor alike: a winner of
    +inf, where ``x - max`` is nan, passes as the module passes it.)"""
    slabs = x.unflatten(-1, (k, -1))
    top = slabs.detach().amax(-2, keepdim=True)
    return (slabs * (1 + torch.sign(slabs.detach() - top))).flatten(-2)


def _slab_columns(weight: Tensor, k: int) -> Tensor:
    """A Linear layer's stacked weight ``(P, out, units)`` with its columns in the slab order of :func:`_slab_linear`
    for groups of ``k`` (it then takes an input in that order)."""
    if k == 1:
        return weight
    P, out, units = weight.shape
    return weight.unflatten(2, (units // k, k)).transpose(2, 3).reshape(P, out, units)


def _td_losses(q_values: Callable[[Mapping[str, Tensor], Tensor], Tensor], gamma: float, params: Mapping[str, Tensor],
               target: Mapping[str, Tensor], obs: Tensor, act: Tensor, nxt: Tensor, rew: Tensor,
               done: Tensor) -> Tensor:
    """The members' MSE TD losses ``(P,)`` on their samples (``obs``, ``nxt`` ``(P, k, obs_dim)``; ``act``, ``rew``,
    ``done`` ``(P, k)``), targets from the target networks without grad."""
    with torch.no_grad():
        next_q = q_values(target, nxt).max(-1).values
        y = rew + (1 - done) * gamma * next_q
    q = q_values(params, obs).gather(-1, act[..., None])[..., 0]
    return ((q - y) ** 2).mean(-1)


def _rmsprop(params: Sequence[Tensor], grads: Sequence[Tensor], square_avgs: Sequence[Tensor], lr: Tensor,
             alpha: float, eps: float) -> None:
    """torch's RMSprop step (no momentum, not centred) in place on stacked parameters, ``lr`` ``(P,)`` per member."""
    for p, g, v in zip(params, grads, square_avgs):
        v.mul_(alpha).addcmul_(g, g, value=1 - alpha)
        p.add_(-lr.view(-1, *([1] * (p.dim() - 1))) * g / (v.sqrt() + eps))  # torch: addcdiv_(g, sqrt(v)+eps, -lr)



def member_policy(config: Mapping[str, Any], seed: int, learning_rate: float | None = None) -> Any:
    """The policy (online and target Q-networks, optimiser with ``learning_rate``, default the config's) that
    ``agents.train ALGO`` builds for ``config`` (its ``algo``: dqn or rainbow) with ``seed``: same modules, same
    initial weights, torch's global generator left where the single run's is when it starts training."""
    from agents.rl.run import policy_kwargs

    obs, act = env_spaces(config["env"], max_episode_steps=config.get("max_episode_steps"),
                          env_kwargs=config.get("env_kwargs") or {})
    set_random_seed(seed)
    lr = config["learning_rate"] if learning_rate is None else learning_rate
    kwargs = policy_kwargs(config)
    if config.get("algo") == "rainbow":  # (what Rainbow's constructor adds to its policy's arguments)
        from agents.rl.rainbow import NETWORK_SETTINGS, policy_settings

        kwargs.update(policy_settings(**{k: config[k] for k in NETWORK_SETTINGS}))
    return ALGOS[config.get("algo", "dqn")].policy(obs, act, lambda _: lr, **kwargs)


def member_q_net(config: Mapping[str, Any], seed: int) -> nn.Module:
    """The Q-network ``agents.train ALGO`` builds for ``config`` with ``seed`` (same modules, same initial weights)."""
    return member_policy(config, seed).q_net
