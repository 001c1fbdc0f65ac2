"""The paper's numbers that reports compare against (:data:`CITATION`), transcribed from its LaTeX source so that
reports work without it.

Only tables are kept here; statements in the running text are not.

tb:sin (appendix "Streaming Learning for Regression"): final test MSE of streaming regression on sin(pi x),
    "averaged over 5 runs, reported with standard errors"; per method the best learning rate from
    {3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5}; SR-NN is the best over ReLU, Sigmoid, ELU and Tanh with the Set-KL
    weight lambda from {0, 0.1, 0.01, 0.001} and target sparsity beta from {0.05, 0.1, 0.2}.
tb:activation: function sparsity and gradient sparsity of each activation (Definition "sparse").
"""

from __future__ import annotations

from fractions import Fraction

__all__ = ["TITLE", "AUTHORS", "CITATION", "METHOD_NAMES", "SIN_TABLE", "SIN_SEEDS", "SIN_LRS", "SRNN_ACTIVATIONS", "SRNN_LAMBDAS", "SRNN_BETAS",
           "SIN_SETTINGS", "ACTIVATION_SPARSITY", "TABLES", "table_rows", "method_name"]

#: The paper this toolkit reproduces and every report and the showcase cite.
TITLE = "Efficient Reinforcement Learning by Reducing Forgetting with Elephant Activation Functions"
AUTHORS = "Qingfeng Lan, Gautham Vasan and A. Rupam Mahmood"
CITATION = f"{AUTHORS}, \u201c{TITLE}\u201d"

#: Display names of the methods, in the paper's table order.
METHOD_NAMES = {"relu": "ReLU", "sigmoid": "Sigmoid", "tanh": "Tanh", "elu": "ELU", "srnn": "SR-NN",
                "elephant": "Elephant"}

#: Table tb:sin, ``{method: (mean, standard error)}`` of the final test MSE over 5 runs.
SIN_TABLE: dict[str, tuple[float, float]] = {
    "relu": (0.4729, 0.0110),
    "sigmoid": (0.4583, 0.0008),
    "tanh": (0.4461, 0.0013),
    "elu": (0.4521, 0.0019),
    "srnn": (0.4061, 0.0036),
    "elephant": (0.0081, 0.0009),
}
SIN_SEEDS = 5
SIN_LRS = (3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5)
SRNN_ACTIVATIONS = ("relu", "sigmoid", "elu", "tanh")
SRNN_LAMBDAS = (0.0, 0.1, 0.01, 0.001)
SRNN_BETAS = (0.05, 0.1, 0.2)
#: The streaming set-up of the appendix: one hidden layer of 1000 units, 10 Adam updates per arriving sample,
#: Elephant with d=8, h=1, a=0.08, sigma_bias=1.28, no layer norm, h and a fixed.
SIN_SETTINGS = {"width": 1000, "updates": 10, "d": 8.0, "h": 1.0, "a": 0.08, "sigma_bias": 1.28}

#: Table tb:activation, ``{activation: (function sparsity, gradient sparsity)}``.
ACTIVATION_SPARSITY: dict[str, tuple[Fraction, Fraction]] = {
    "relu": (Fraction(1, 2), Fraction(1, 2)),
    "sigmoid": (Fraction(1, 2), Fraction(1)),
    "tanh": (Fraction(0), Fraction(1)),
    "elu": (Fraction(0), Fraction(1, 2)),
    "elephant": (Fraction(1), Fraction(1)),
}

#: The tables above with their column names, keyed by their LaTeX labels.
TABLES = {
    "tb:sin": (["Method", "Test Performance (MSE)"], SIN_TABLE),
    "tb:activation": (["Activation", "Function Sparsity", "Gradient Sparsity"], ACTIVATION_SPARSITY),
}


def method_name(method: str) -> str:
    """Display name of a method key (``"srnn"`` -> ``"SR-NN"``); unknown keys are returned as they are."""
    return METHOD_NAMES.get(method, method)


def table_rows(label: str) -> list[list[str]]:
    """Table `label` as rows of strings, header first: ``["relu", "0.4729 +- 0.0110"]``,
    ``["relu", "1/2", "1/2"]``. Raises KeyError for a table not kept here."""
    columns, values = TABLES[label]
    rows = [list(columns)]
    for key, cells in values.items():
        if label == "tb:sin":
            rows.append([key, f"{cells[0]:.4f} +- {cells[1]:.4f}"])
        else:
            rows.append([key, *(str(c) for c in cells)])
    return rows
