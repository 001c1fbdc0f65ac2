"""Which runs are one configuration: config keys that equal across seeds, labels naming the settings that differ
between configurations, groups of runs per configuration, and the parts of a report (one per algorithm and
environment). Pure Python on :class:`runlog.Run` configs; :mod:`reports.data` re-exports these names.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from runlog import Run

__all__ = ["EXECUTION_KEYS", "config_key", "config_labels", "group_by_config", "partition", "MAX_LABEL",
           "short_labels"]


def _format_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


#: config keys that say how a run was executed, not what it computes: never part of a setting (single runs' logs
#: record torch_threads, population members' logs do not; seeds run on a GPU and on CPUs are one setting)
EXECUTION_KEYS = ("torch_threads", "device")


def config_key(config: Mapping[str, Any], ignore: Sequence[str] = ("seed",)) -> str:
    """`config` without the keys in `ignore` and :data:`EXECUTION_KEYS`, as JSON with sorted keys: equal for runs of
    one configuration."""
    return json.dumps({k: v for k, v in config.items() if k not in (*ignore, *EXECUTION_KEYS)}, sort_keys=True,
                      default=str)


def _leaves(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys, e.g. ``{"act_kwargs": {"d": 4}}`` -> ``{"act_kwargs.d": 4}``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


#: settings that belong to the activation: labels leave them out where ``act`` alone decides them
_ACTIVATION_KEYS = ("act_kwargs", "sigma_bias", "layer_norm")


def config_labels(configs: Sequence[Mapping[str, Any]], skip: Sequence[str] = ()) -> list[str]:
    """A label per config naming the settings that differ between `configs`, e.g. ``"act=elephant lr=0.001"``.

    Nested dicts are compared entry by entry (``act_kwargs.d=4``; an entry a config lacks is left out of its
    label, a top-level key it lacks shows as ``key=(unset)``). The activation's own settings (``act_kwargs``,
    ``sigma_bias``, ``layer_norm``) are left out where they follow from ``act`` (e.g. Elephant's defaults against
    ReLU's). The ``derived`` entry (recomputed from the settings), :data:`EXECUTION_KEYS` and the top-level keys in
    `skip` are never shown. Labels may be empty.
    """
    hidden = {"derived", *EXECUTION_KEYS, *skip}
    top = {k for c in configs for k in c}
    flat = [{k: v for k, v in _leaves(c).items() if k.split(".")[0] not in hidden} for c in configs]
    keys = list(dict.fromkeys(k for c in flat for k in c))

    def value(c: Mapping[str, Any], k: str) -> str:
        return json.dumps(c[k], sort_keys=True, default=str) if k in c else "(unset)"

    def follows_from_act(k: str) -> bool:
        by_act: dict[str, set[str]] = {}
        for c in flat:
            by_act.setdefault(value(c, "act"), set()).add(value(c, k))
        return k.split(".")[0] in _ACTIVATION_KEYS and len(by_act) > 1 and all(len(v) == 1 for v in by_act.values())

    differing = [k for k in keys if len({value(c, k) for c in flat}) > 1 and not follows_from_act(k)]
    return [" ".join(f"{k}={_format_value(c[k])}" if k in c else f"{k}=(unset)"
                     for k in differing if k in c or k in top) for c in flat]


def group_by_config(runs: Iterable[Run], ignore: Sequence[str] = ("seed",),
                    fallback: Sequence[str] = ("algo", "env", "act")) -> dict[str, list[Run]]:
    """Group runs whose configs are equal except for the keys in `ignore`.

    Labels list the settings that differ between groups (see `config_labels`), e.g. ``"act=elephant
    lr=0.001"``; groups that differ in none of them (e.g. a single group) are labelled by the `fallback` keys.
    Groups keep the order of their first run; runs within a group are sorted by seed.
    """
    groups: dict[str, list[Run]] = {}
    configs: dict[str, dict] = {}
    for run in runs:
        key = config_key(run.config, ignore)
        groups.setdefault(key, []).append(run)
        configs.setdefault(key, {k: v for k, v in run.config.items() if k not in ignore})
    texts = config_labels(list(configs.values()))
    if not any(texts):
        texts = [" ".join(f"{k}={_format_value(c[k])}" for k in fallback if k in c)
                 for c in configs.values()]
    labels: dict[str, str] = {}
    for key, text in zip(configs, texts):
        label = text or "all runs"
        n = sum(1 for other in labels.values() if other == label or other.startswith(f"{label} #"))
        labels[key] = f"{label} #{n + 1}" if n else label  # e.g. "1" and 1 print alike
    return {labels[key]: sorted(group, key=lambda r: r.seed) for key, group in groups.items()}


def partition(runs: Iterable[Run]) -> dict[str, list[Run]]:
    """Runs split by what they learn: ``{"DQN on CartPole-v1": [...], ...}`` by ``algo`` (or the streaming
    ``command``) and ``env``, in first-seen order. A report gives each part its own section, configurations and
    labels, so that runs of different algorithms or environments are never compared on one axis."""
    parts: dict[str, list[Run]] = {}
    for run in runs:
        c = run.config
        learner = str(c.get("algo") or c.get("command") or "runs")  # streaming learners: algo is the command
        parts.setdefault(f"{learner.upper()} on {c['env']}" if c.get("env") else learner, []).append(run)
    return parts


#: longest group label a report shows; longer ones become ``config K`` (the table gives their settings)
MAX_LABEL = 60


def short_labels(labels: Sequence[str], limit: int = MAX_LABEL) -> dict[str, str]:
    """``{label: short label}``: labels of at most ``limit`` characters as they are, longer ones ``config K``."""
    return {label: label if len(label) <= limit else f"config {i + 1}" for i, label in enumerate(labels)}
