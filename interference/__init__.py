"""interference: measure why a network forgets (empirical NTK, gradient covariance, sparsity) on any nn.Module.

Pure functions on PyTorch modules; nothing here knows about RL, files or the other packages.
"""

from .activation_spec import (
    ActArg,
    ActivationSpec,
    activation_names,
    activation_spec,
    make_activation,
    register_activation,
)
from .activations import FTA, LWTA, Elephant, Maxout, elephant
from .closed_form import one_hidden_layer_ntk
from .fisher import GradMoments, grad_moments, squared_grad_sum
from .gradcov import gradient_covariance, per_sample_grads
from .noisy import NoisyLinear, resample_noise, set_noise
from .nets import count_parameters, match_width, mlp, nature_cnn, spread_bias_
from .ntk import explain, ntk
from .plan import ParamPath, Plan
from .structure import cross_entropy
from .rules import Factor, LayerRule, register_rule, registered_rules
from .plasticity import (
    condition_number,
    effective_rank,
    feature_norm,
    interference_mass,
    kernel_effective_rank,
    singular_values,
    srank,
)
from .sparsity import (
    dormant_scores,
    dormant_units,
    function_sparsity,
    gradient_sparsity,
    representation_sparsity,
    saturated_units,
    sparsity_limit,
)

__all__ = [
    "ActArg",
    "ActivationSpec",
    "Elephant",
    "FTA",
    "Factor",
    "GradMoments",
    "LayerRule",
    "ParamPath",
    "Plan",
    "LWTA",
    "Maxout",
    "NoisyLinear",
    "activation_names",
    "activation_spec",
    "count_parameters",
    "cross_entropy",
    "dormant_scores",
    "effective_rank",
    "srank",
    "singular_values",
    "feature_norm",
    "kernel_effective_rank",
    "condition_number",
    "interference_mass",
    "dormant_units",
    "elephant",
    "explain",
    "function_sparsity",
    "gradient_covariance",
    "gradient_sparsity",
    "grad_moments",
    "make_activation",
    "match_width",
    "mlp",
    "nature_cnn",
    "ntk",
    "one_hidden_layer_ntk",
    "per_sample_grads",
    "squared_grad_sum",
    "register_activation",
    "register_rule",
    "resample_noise",
    "set_noise",
    "registered_rules",
    "representation_sparsity",
    "saturated_units",
    "sparsity_limit",
    "spread_bias_",
]
