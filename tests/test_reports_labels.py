"""What a reader sees on a report page: captions (units said once), titles (seed counts filled in, one
configuration worded as one), legends (layers named "hidden 1", "output", not ``q_net.0``), and the NTK's condition
number of old and new logs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from probes import PROBES
from runlog import FieldDoc, ProbeSchema
from runlog import Field, RunLog, read_run
from reports import build, data, fields, plots
from reports.__main__ import main
from reports.labels import layer_labels, mean_se_over, parameter_labels, seeds, with_units

ROOT = Path(__file__).resolve().parents[1]
STEPS = [1000, 2000, 3000, 4000]
#: the DQN Q-network of an Elephant run as the weights probe records it: Linear, LayerNorm, Elephant, Linear
MODULES = {"elephant": [["features_extractor.flatten", "other", "Flatten"], ["q_net.0", "linear", "Linear"],
                        ["q_net.1", "norm", "LayerNorm"], ["q_net.2", "activation", "Elephant"],
                        ["q_net.3", "linear", "Linear"]],
           "relu": [["features_extractor.flatten", "other", "Flatten"], ["q_net.0", "linear", "Linear"],
                    ["q_net.1", "activation", "ReLU"], ["q_net.2", "linear", "Linear"]]}
#: the plasticity probe's schema as logs before ntk_condition_nonzero stored it (its meaning names its unit)
OLD_PLASTICITY = ProbeSchema("Plasticity", {
    "effective_rank": FieldDoc("effective rank of the penultimate features on the probe inputs", "rank"),
    "dormant": FieldDoc("fraction of ReDo-dormant units (score <= tau)", "fraction", ("layer",), "per_layer", "layers"),
    "weight_norm": FieldDoc("Frobenius norm of each Linear layer's weight", "L2 norm", ("layer",), "per_layer",
                            "linear_layers"),
    "ntk_effective_rank": FieldDoc("effective rank of the NTK on the probe inputs", "rank"),
    "ntk_condition": FieldDoc("condition number of the NTK on the probe inputs (log10)", "log10"),
})


def write_run(path, act, seed, *, old=False, flat=False, modules=True):
    """A DQN run log on CartPole with the plasticity, sparsity and weights probes, as written before
    ``ntk_condition_nonzero`` (``old``; ``flat``: its ntk_condition at the round-off floor throughout) or now."""
    rng = np.random.default_rng([seed, old, flat])
    mods = MODULES[act]
    linear = [m[0] for m in mods if m[1] == "linear"]
    acts = [m[0] for m in mods if m[1] == "activation"]
    params = [f"{m[0]}.{p}" for m in mods if m[1] in ("linear", "norm") for p in ("weight", "bias")]
    params += [f"{a}.log_{p}" for a in acts if act == "elephant" for p in ("h", "a")]
    ntk = {"ntk_condition": Field(())} if old else {"ntk_numerical_rank": Field(()), "ntk_condition_nonzero": Field(())}
    probes = {"plasticity": {"effective_rank": Field(()), "dormant": Field((len(acts),)),
                             "weight_norm": Field((len(linear),)), "ntk_effective_rank": Field(()), **ntk},
              "sparsity": {"activation_sparsity": Field((len(acts),)), "dormant": Field((len(acts),))},
              "weights": {"param_norm": Field((len(params),)), "grad_norm": Field((len(params),))}}
    settings = {"plasticity": {"layers": acts, "linear_layers": linear}, "sparsity": {"layers": acts},
                "weights": {"parameters": params, **({"modules": mods} if modules else {})}}
    schema = {"plasticity": (OLD_PLASTICITY if old else PROBES["plasticity"].schema).to_json(),
              "sparsity": PROBES["sparsity"].schema.to_json(), "weights": PROBES["weights"].schema.to_json()}
    with RunLog(path, config={"algo": "dqn", "env": "CartPole-v1", "act": act}, seed=seed, probes=probes,
                scalars=["episode_return"], probe_settings=settings, extra_attrs={"probe_schema": schema}) as log:
        for step in STEPS:
            cond = {"ntk_condition": 14.14841 if flat else rng.uniform(3, 6)} if old else \
                {"ntk_numerical_rank": float(rng.integers(28, 33)), "ntk_condition_nonzero": rng.uniform(3, 5)}
            log.append("plasticity", step, effective_rank=rng.uniform(5, 10), dormant=rng.uniform(0, 1, len(acts)),
                       weight_norm=rng.uniform(1, 9, len(linear)), ntk_effective_rank=rng.uniform(2, 9), **cond)
            log.append("sparsity", step, activation_sparsity=rng.uniform(0, 1, len(acts)),
                       dormant=rng.uniform(0, 1, len(acts)))
            log.append("weights", step, param_norm=rng.uniform(1, 2, len(params)),
                       grad_norm=rng.uniform(0, 1, len(params)))
            log.scalar("episode_return", step, float(rng.uniform(0, 200)))


def captions(index: Path) -> list[str]:
    return re.findall(r"<figcaption>(.*?)</figcaption>", index.read_text())


def notes(index: Path) -> list[str]:
    return re.findall(r'<p class="note">(.*?)</p>', index.read_text())


def figure_texts(fig) -> dict[str, list[str]]:
    """A figure's words: ``titles`` (its suptitle, the panels' titles), ``labels`` (axis labels), ``legends``."""
    titles = [fig._suptitle.get_text()] if fig._suptitle is not None else []
    titles += [ax.get_title() for ax in fig.axes if ax.get_title()]
    labels = [t for ax in fig.axes for t in (ax.get_xlabel(), ax.get_ylabel()) if t]
    legends = [ax.get_legend() for ax in fig.axes] + list(fig.legends)
    return {"titles": titles, "labels": labels,
            "legends": [t.get_text() for lg in legends if lg is not None for t in lg.get_texts()]}


def build_page(paths, out, monkeypatch) -> tuple[Path, dict[str, dict[str, list[str]]]]:
    """The report of run logs ``paths`` in ``out``, and the words of each of its figures by file name."""
    figures = {}
    save = plots.save

    def keep(fig, path, *args, **kwargs):
        figures[Path(path).name] = figure_texts(fig)
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(plots, "save", keep)
    index = build.build_report([read_run(p) for p in paths], out)
    return index, figures


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """elephant and relu, 2 seeds each, new logs."""
    root = tmp_path_factory.mktemp("runs")
    for act in ("elephant", "relu"):
        for seed in (0, 1):
            write_run(root / act / f"seed{seed}.h5", act, seed)
    return root


@pytest.fixture
def page(run_dir, tmp_path, monkeypatch):
    return build_page(sorted(run_dir.rglob("*.h5")), tmp_path / "out", monkeypatch)


# --- layer names --------------------------------------------------------------------------------------------------


def test_layer_labels_name_layers_as_a_reader_does():
    assert layer_labels(MODULES["elephant"][1:]) == {"q_net.0": "hidden 1", "q_net.1": "LayerNorm 1",
                                                     "q_net.2": "activation 1", "q_net.3": "output"}
    two = [("q_net.0", "linear"), ("q_net.1", "activation"), ("q_net.2", "linear"), ("q_net.3", "activation"),
           ("q_net.4", "linear")]
    assert list(layer_labels(two).values()) == ["hidden 1", "activation 1", "hidden 2", "activation 2", "output"]
    # PPO: the policy and value networks count their own layers; the heads are outputs named by their module
    ppo = [(f"mlp_extractor.{net}_net.{i}", kind) for net in ("policy", "value")
           for i, kind in enumerate(("linear", "norm", "activation"))] + [("action_net", "linear"),
                                                                          ("value_net", "linear")]
    assert layer_labels(ppo) == {
        "mlp_extractor.policy_net.0": "policy hidden 1", "mlp_extractor.policy_net.1": "policy norm 1",
        "mlp_extractor.policy_net.2": "policy activation 1", "mlp_extractor.value_net.0": "value hidden 1",
        "mlp_extractor.value_net.1": "value norm 1", "mlp_extractor.value_net.2": "value activation 1",
        "action_net": "action output", "value_net": "value output"}
    # the path the PPO probe forward takes (plasticity's layers): one stream, one output
    assert list(layer_labels([("mlp_extractor.policy_net.0", "linear"), ("mlp_extractor.policy_net.2", "activation"),
                              ("action_net", "linear")]).values()) == ["hidden 1", "activation 1", "output"]
    sac = [("actor.latent_pi.0", "linear"), ("actor.latent_pi.1", "activation"), ("actor.mu", "linear"),
           ("actor.log_std", "linear")]
    assert list(layer_labels(sac).values()) == ["hidden 1", "activation 1", "mu output", "log_std output"]
    critics = [(f"{c}.qf{q}.{i}", kind) for c in ("critic", "critic_target") for q in (0, 1)
               for i, kind in enumerate(("linear", "activation", "linear"))]
    labels = layer_labels(critics)
    assert labels["critic.qf0.0"] == "critic.qf0 hidden 1"
    assert labels["critic_target.qf1.2"] == "critic_target.qf1 output"
    rainbow = [(f"{s}.{i}", kind) for s in ("value", "advantage")
               for i, kind in enumerate(("linear", "norm", "activation", "linear"))]
    labels = layer_labels(rainbow)
    assert labels["advantage.0"] == "advantage hidden 1" and labels["value.3"] == "value output"
    cnn = [("features_extractor.cnn.0", "conv"), ("features_extractor.cnn.1", "activation"),
           ("features_extractor.cnn.2", "conv"), ("features_extractor.cnn.3", "activation"),
           ("features_extractor.cnn.4", "other", "Flatten"), ("features_extractor.linear.0", "linear"),
           ("features_extractor.linear.1", "activation"), ("q_net.0", "linear")]
    assert list(layer_labels(cnn).values()) == ["conv 1", "activation 1", "conv 2", "activation 2",
                                                "features_extractor.cnn.4", "hidden 1", "activation 3", "output"]
    assert list(layer_labels([("0", "linear"), ("1", "activation"), ("2", "linear")]).values()) == \
        ["hidden 1", "activation 1", "output"]  # a bare Sequential (streaming learners)
    assert list(layer_labels([("fc1", "linear"), ("act", "activation"), ("fc2", "linear")]).values()) == \
        ["hidden 1", "activation 1", "output"]  # named children, no indices


def test_layer_labels_of_old_logs_known_by_their_parameters_only():
    # a Linear or a LayerNorm: a norm sits between a layer and an activation; a skipped index is a module without
    # parameters (ReLU), so the layer before it is hidden
    assert list(layer_labels([("q_net.0", "param"), ("q_net.1", "param"), ("q_net.2", "activation"),
                              ("q_net.3", "param")]).values()) == ["hidden 1", "norm 1", "activation 1", "output"]
    assert list(layer_labels([("q_net.0", "param"), ("q_net.2", "param")]).values()) == ["hidden 1", "output"]


def test_parameter_labels_name_the_layer_and_keep_the_parameter():
    labels = layer_labels(MODULES["elephant"])
    assert parameter_labels(["q_net.0.weight", "q_net.1.bias", "q_net.2.log_h", "q_net.3.bias", "log_std"], labels) \
        == ["hidden 1 weight", "LayerNorm 1 bias", "activation 1 log_h", "output bias", "log_std"]


@pytest.mark.parametrize("modules", [True, False])
def test_one_naming_for_every_probe_of_a_run(tmp_path, modules):
    write_run(tmp_path / "run.h5", "elephant", 0, modules=modules)
    run = read_run(tmp_path / "run.h5")
    norm = "LayerNorm 1" if modules else "norm 1"  # older logs do not say which class a module is
    assert data.entry_labels(run, "plasticity", "linear_layers", 2) == (["hidden 1", "output"],
                                                                        {"hidden 1": "q_net.0", "output": "q_net.3"})
    assert data.entry_labels(run, "sparsity", "layers", 1)[0] == ["activation 1"]
    names, paths = data.entry_labels(run, "weights", "parameters", 8)
    assert names[:3] == ["hidden 1 weight", "hidden 1 bias", f"{norm} weight"] and names[-1] == "activation 1 log_a"
    assert paths == {"hidden 1": "q_net.0", norm: "q_net.1", "output": "q_net.3", "activation 1": "q_net.2"}
    assert data.entry_labels(run, "sparsity", "layers", 3) == (["layer 0", "layer 1", "layer 2"], {})


def test_report_legends_name_layers_not_modules(page):
    index, figures = page
    legends = {f: t["legends"] for f, t in figures.items() if f.startswith("probe_") and "per_layer" in f}
    assert legends and all(legends.values())
    shown = {text for texts in legends.values() for text in texts}
    assert not [t for t in shown if "q_net" in t]
    assert {"activation 1", "hidden 1", "output", "hidden 1 weight", "LayerNorm 1 bias", "output bias"} <= shown
    assert any("layers: hidden 1 = q_net.0, output = q_net.3" in c for c in captions(index))  # paths in captions


# --- captions and titles ------------------------------------------------------------------------------------------


def _repeats(text: str) -> list[str]:
    """Parenthesised phrases that a text says twice (``(log10) (log10)``)."""
    groups = re.findall(r"\([^()]*\)", text)
    return [g for g in set(groups) if groups.count(g) > 1]


def test_with_units_says_a_unit_once():
    assert with_units("condition number (log10)", "log10") == "condition number (log10)"
    assert with_units("fraction of dead units", "fraction") == "fraction of dead units"
    assert with_units("mean L2 norm of the features", "L2 norm") == "mean L2 norm of the features"
    assert with_units("ntk condition", "log10") == "ntk condition (log10)"
    assert with_units("srank_delta of the features", "rank") == "srank_delta of the features (rank)"
    assert with_units("x", "") == "x"


def test_no_schema_caption_repeats_its_unit():
    docs = [(name, field, doc) for name, cls in PROBES.items() if cls.schema
            for field, doc in cls.schema.fields.items()] + \
           [("plasticity", field, doc) for field, doc in OLD_PLASTICITY.fields.items()]
    for probe, field, doc in docs:
        caption = fields._caption(probe, field, doc)
        assert not _repeats(caption), caption
        if doc.units:
            assert caption.count(f"({doc.units})") <= 1, caption


def test_no_caption_or_figure_text_repeats_a_parenthesised_unit(run_dir, tmp_path, monkeypatch):
    old = tmp_path / "old"
    for seed in (0, 1):
        write_run(old / f"seed{seed}.h5", "relu", seed, old=True, modules=False)
    new = sorted((run_dir / "elephant").rglob("*.h5"))  # new Elephant logs beside old ReLU ones
    index, figures = build_page([*new, *sorted(old.rglob("*.h5"))], tmp_path / "out", monkeypatch)
    texts = captions(index) + [t for f in figures.values() for t in f["titles"] + f["labels"]]
    assert any(c.startswith("plasticity.ntk_condition:") for c in captions(index))
    assert len(captions(index)) > 10
    assert not [t for t in texts if _repeats(t)]
    assert not [t for t in texts if "(log10) (log10)" in t]


def test_seed_counts_are_filled_in():
    assert mean_se_over([2, 2]) == "mean ± SE over 2 seeds"
    assert mean_se_over([1]) == "1 seed (no standard error)"
    assert mean_se_over([2, 3]) == "mean ± SE over 2–3 seeds"
    assert seeds(1) == "1 seed" and seeds(3) == "3 seeds"


def test_titles_and_captions_say_how_many_seeds(page):
    index, figures = page
    titles = [t for f in figures.values() for t in f["titles"]]
    words = titles + captions(index)
    assert not [t for t in words if re.search(r"\bover n\b|seed\(s\)", t)]
    assert "mean ± SE over 2 seeds" in figures["curve_episode_return.png"]["titles"]
    assert "plasticity.effective_rank: mean ± SE over 2 seeds" in \
        figures["probe_plasticity_effective_rank.png"]["titles"]
    assert any("mean over 2 seeds" in c for c in captions(index))


def test_one_run_is_worded_as_one_seed_and_one_configuration(run_dir, tmp_path, monkeypatch):
    index, figures = build_page([run_dir / "elephant" / "seed0.h5"], tmp_path / "out", monkeypatch)
    words = captions(index) + [t for f in figures.values() for t in f["titles"]]
    assert not [t for t in words if "side by side" in t or "per configuration" in t or "±" in t]
    assert "1 seed (no standard error)" in figures["curve_episode_return.png"]["titles"]
    assert any(c.endswith("; 1 seed; layers: activation 1 = q_net.2") for c in captions(index))


def test_gradcov_caption_of_one_and_of_several_configurations():
    from reports.fields import one_seed
    from reports.data import Record

    record = Record(step=10, target=10, seed=3, value=np.eye(2))
    assert one_seed({"act=elephant": [record]}) == "seed 3"
    assert one_seed({"a": [record], "b": [record]}) == "one seed per configuration"


def test_no_templated_seed_count_is_left_in_the_sources():
    sources = [*(ROOT / "reports").glob("*.py"), *(ROOT / "reports" / "classinc").glob("*.py")]
    assert sources
    assert not [str(p) for p in sources if re.search(r"over n seeds|seed\(s\)", p.read_text())]


# --- the NTK's condition number, old and new logs ----------------------------------------------------------------


def test_new_logs_show_the_condition_number_on_the_nonzero_spectrum(page):
    index, figures = page
    (caption,) = [c for c in captions(index) if c.startswith("plasticity.ntk_condition_nonzero")]
    assert "on the numerically non-zero spectrum" in caption
    assert figures["probe_plasticity_ntk_condition_nonzero.png"]["labels"][1] == "ntk condition nonzero (log10)"
    assert "probe_plasticity_ntk_numerical_rank.png" in figures


def test_old_logs_still_read_and_plot_their_condition_number(tmp_path, monkeypatch):
    for seed in (0, 1):
        write_run(tmp_path / "old" / f"seed{seed}.h5", "relu", seed, old=True, modules=False)
    index, figures = build_page(sorted((tmp_path / "old").rglob("*.h5")), tmp_path / "out", monkeypatch)
    (caption,) = [c for c in captions(index) if c.startswith("plasticity.ntk_condition:")]
    assert caption.count("(log10)") == 1 and "ntk_condition_nonzero" in caption  # says what replaced it
    assert "probe_plasticity_ntk_condition.png" in figures
    assert figures["probe_plasticity_per_layer1_0.png"]["legends"] == ["hidden 1", "output"]  # weight_norm, named
    # from plasticity's linear_layers: the log has no module kinds


def test_a_curve_flat_in_every_run_is_a_note_not_a_figure(tmp_path, monkeypatch):
    for seed in (0, 1):
        write_run(tmp_path / "old" / f"seed{seed}.h5", "relu", seed, old=True, flat=True)
    index, figures = build_page(sorted((tmp_path / "old").rglob("*.h5")), tmp_path / "out", monkeypatch)
    assert "probe_plasticity_ntk_condition.png" not in figures
    (note,) = [n for n in notes(index) if "ntk_condition" in n]
    assert "is 14.15 in every record of every run (not plotted)" in note


def test_old_and_new_logs_of_one_configuration_together(run_dir, tmp_path, monkeypatch):
    write_run(tmp_path / "old.h5", "relu", 5, old=True)  # same configuration as the new relu runs
    index, figures = build_page([*sorted(run_dir.rglob("*.h5")), tmp_path / "old.h5"], tmp_path / "out", monkeypatch)
    assert figures["probe_plasticity_ntk_condition_nonzero.png"]["legends"] == ["act=elephant (n=2)", "act=relu (n=2)"]
    assert figures["probe_plasticity_ntk_condition.png"]["legends"] == ["act=relu (n=1)"]
    assert figures["probe_plasticity_ntk_condition.png"]["titles"] == ["plasticity.ntk_condition: 1 seed (no standard "
                                                                      "error)"]


def test_cli_writes_the_page_of_old_and_new_logs(run_dir, tmp_path, capsys):
    write_run(tmp_path / "old.h5", "relu", 5, old=True)
    assert main([str(run_dir), str(tmp_path / "old.h5"), "-o", str(tmp_path / "out")]) == 0
    text = Path(capsys.readouterr().out.strip().splitlines()[-1]).read_text()
    assert "plasticity.ntk_condition:" in text and "plasticity.ntk_condition_nonzero:" in text
