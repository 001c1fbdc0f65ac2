"""Axis labels with units, from a run's config: what a step counts and what each scalar series measures; the words
of captions and titles (units appended once, seed counts filled in); and layer names as a reader says them
("hidden 1", "activation 1", "output") from the module paths a probe records (``q_net.0``, ``action_net``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["SCALAR_LABELS", "scalar_label", "step_label", "with_units", "seeds", "mean_se_over", "LAYER_KINDS",
           "layer_labels", "parameter_labels"]

#: y-axis labels of the scalars, with units
SCALAR_LABELS = {"episode_return": "episode return (sum of rewards)", "episode_length": "episode length (env steps)",
                 "eval_return": "evaluation return (greedy, whole games)", "eval_length": "evaluation length (env steps)",
                 "test_mse": "test MSE", "loss": "training loss", "actor_loss": "actor loss",
                 "critic_loss": "critic loss", "learning_rate": "learning rate"}


def _is_atari(config: Mapping) -> bool:
    env = str(config.get("env", ""))
    return env.startswith("ALE/") or "NoFrameskip" in env


def scalar_label(name: str, config: Mapping) -> str:
    """The y-axis label of a scalar series, with its unit (Atari episode lengths count emulator frames)."""
    if name in ("episode_length", "eval_length") and _is_atari(config):
        skip = (config.get("atari_wrapper_kwargs") or {}).get("frame_skip", 4)
        return f"{'episode' if name == 'episode_length' else 'evaluation'} length (emulator frames, {skip} per agent step)"
    return SCALAR_LABELS.get(name, name.replace("_", " "))


def step_label(config: Mapping) -> str:
    """The x-axis label: env steps (RL agents, whose configs name an ``env``) or samples seen (streaming
    learners)."""
    return "env steps" if "env" in config else "samples seen"


# --- caption words ------------------------------------------------------------------


def with_units(text: str, units: str) -> str:
    """``text (units)``, unless ``units`` is empty or ``text`` names it already (``"... (log10)"``, ``"fraction of
    ..."``, ``"mean L2 norm of ..."``): a schema's meaning may say its unit, and a caption must not say it twice."""
    units = units.strip()
    if not units or re.search(rf"(?<!\w){re.escape(units)}(?!\w)", text, re.IGNORECASE):
        return text
    return f"{text} ({units})"


def seeds(n: int) -> str:
    """``1 seed``, ``2 seeds``."""
    return f"{n} seed{'s' * (n != 1)}"


def mean_se_over(counts: Iterable[int]) -> str:
    """What a figure of means over seeds shows, with the numbers of seeds ``counts`` (one per line) filled in:
    ``mean ± SE over 3 seeds``, ``mean ± SE over 2–3 seeds`` (where they differ), ``1 seed (no standard error)``."""
    ns = sorted({int(n) for n in counts})
    if not ns:
        return "mean ± SE over seeds"
    if ns[-1] <= 1:
        return "1 seed (no standard error)"
    if len(ns) == 1:
        return f"mean ± SE over {seeds(ns[0])}"
    return f"mean ± SE over {ns[0]}–{ns[-1]} seeds (no band where 1)" if ns[0] <= 1 else \
        f"mean ± SE over {ns[0]}–{ns[-1]} seeds"


# --- layer names --------------------------------------------------------------------

#: module kinds of :func:`probes.builtin.module_kinds`; ``param`` is a module known only by its parameters (a log
#: written before the weights probe recorded kinds): a Linear layer, or a norm between a layer and an activation
LAYER_KINDS = ("linear", "conv", "norm", "activation", "other", "param")


def _stream(path: str) -> tuple[str, bool]:
    """``(stream, sequential)``: the module path up to its first index (``mlp_extractor.policy_net`` of
    ``mlp_extractor.policy_net.0``), or, for a module with no index, its parent (``actor`` of ``actor.mu``)."""
    parts = path.split(".")
    first = next((i for i, p in enumerate(parts) if p.isdigit()), None)
    if first is None:
        return ".".join(parts[:-1]), False
    return ".".join(parts[:first]), True


def _index(path: str) -> int | None:
    last = path.rpartition(".")[2]
    return int(last) if last.isdigit() else None


def _natural(path: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.split("."))


def _short(name: str) -> str:
    """A reader's name of a stream or head: its last component without ``_net`` (``policy_net`` -> ``policy``)."""
    last = name.rpartition(".")[2]
    return (last[:-4] if last.endswith("_net") and len(last) > 4 else last) or name


def _stream_names(streams: Sequence[str]) -> dict[str, str]:
    """Short names of streams, unique: the last component without ``_net``, longer suffixes of the path where two
    would read alike (``critic.qf0``, ``critic_target.qf0``); the model's own children: ``model``."""
    split = {s: s.split(".") if s else ["model"] for s in streams}
    names = {}
    for s, parts in split.items():
        k = next((k for k in range(1, len(parts) + 1)
                  if all(t == s or q[-k:] != parts[-k:] for t, q in split.items())), len(parts))
        names[s] = ".".join(parts[-k:-1] + [_short(parts[-1])])
    return names


def layer_labels(modules: Sequence[Sequence[str]]) -> dict[str, str]:
    """``{module path: label}``: the layers of one model named as a reader does, from ``(path, kind[, class
    name])`` in model order (kinds :data:`LAYER_KINDS`).

    Modules are grouped in streams, the ``Sequential`` children of one container (``q_net.0`` .. ``q_net.3``) or
    the un-indexed children of one module (``action_net``, ``value_net``). In a stream a Linear layer with anything
    after it (an activation, a norm, or an index skipped: a module without parameters) is ``hidden k``, the last
    one is an ``output``; an un-indexed Linear layer is an output unless an activation or a norm follows it.
    Convolutions are ``conv k``, activations ``activation k``, norms by their class (``LayerNorm k``), each
    counted in model order. Where two or more streams have hidden layers (PPO's policy and value networks,
    Rainbow's advantage and value streams, SAC's critics) each stream counts its own and its labels start with its
    name (``policy hidden 1``). One output in all is ``output``; several are named by their stream or module
    (``action output``, ``value output``; ``mu output``). Other modules keep their path.
    """
    entries = [(str(m[0]), str(m[1]), str(m[2]) if len(m) > 2 else "") for m in modules]
    streams: dict[tuple[str, bool], list[tuple[str, str, str]]] = {}
    for path, kind, cls in entries:
        streams.setdefault(_stream(path), []).append((path, kind, cls))
    for key, members in streams.items():
        if key[1]:
            members.sort(key=lambda m: _natural(m[0]))
    kinds = {path: kind for path, kind, _ in entries}
    # modules known only by their parameters: a norm between a layer and an activation, else a Linear layer
    for (_, seq), members in streams.items():
        for i, (path, kind, cls) in enumerate(members):
            if kind != "param":
                continue
            prev = members[i - 1] if i > 0 else None
            nxt = members[i + 1] if i + 1 < len(members) else None
            between = (seq and prev is not None and nxt is not None and kinds[prev[0]] in ("linear", "param", "conv")
                       and kinds[nxt[0]] == "activation" and _index(prev[0]) == _index(path) - 1
                       and _index(nxt[0]) == _index(path) + 1)
            kinds[path] = "norm" if between else "linear"
    role: dict[str, str] = {}  # linear layers: hidden or output
    for (_, seq), members in streams.items():
        for i, (path, _, _) in enumerate(members):
            if kinds[path] != "linear":
                continue
            nxt = members[i + 1] if i + 1 < len(members) else None
            if seq:
                role[path] = "hidden" if nxt is not None else "output"
            else:
                role[path] = "hidden" if nxt is not None and kinds[nxt[0]] in ("activation", "norm") else "output"
    hidden_streams = [key for key, members in streams.items() if any(role.get(p) == "hidden" for p, _, _ in members)]
    prefixed = len(hidden_streams) > 1
    names = _stream_names([s for s, _ in streams])
    outputs = [p for p, r in role.items() if r == "output"]
    labels: dict[str, str] = {}
    counters: dict[tuple[str, str], int] = {}
    for key, members in streams.items():
        stream, seq = key
        prefix = f"{names[stream]} " if prefixed and seq else ""
        scope = stream if prefixed else ""
        for path, _, cls in members:
            kind = kinds[path]
            if kind == "linear" and role[path] == "output":
                labels[path] = "output" if len(outputs) == 1 else f"{names[stream] if seq else _short(path)} output"
                continue
            word = {"linear": "hidden", "conv": "conv", "activation": "activation",
                    "norm": cls if cls and cls[0].isupper() else "norm"}.get(kind)
            if word is None:
                labels[path] = path
                continue
            counters[(scope, word)] = counters.get((scope, word), 0) + 1
            labels[path] = f"{prefix}{word} {counters[(scope, word)]}"
    seen: dict[str, int] = {}
    for label in labels.values():
        seen[label] = seen.get(label, 0) + 1
    return {path: f"{label} ({path})" if seen[label] > 1 else label for path, label in labels.items()}


def parameter_labels(parameters: Sequence[str], labels: Mapping[str, str]) -> list[str]:
    """Parameter names with their module named by ``labels`` (:func:`layer_labels`): ``q_net.0.weight`` ->
    ``hidden 1 weight``; a parameter of an unnamed module keeps its name."""
    out = []
    for name in parameters:
        module, _, leaf = name.rpartition(".")
        out.append(f"{labels[module]} {leaf}" if module in labels else name)
    return out
