# SPDX-License-Identifier: Apache-2.0
"""xsoftmax: softmax heads for extreme classification (full, hierarchical, sampled, KNN) as PyTorch
loss modules over the header-only C++ library. See ``xsoftmax.torch``."""
from . import _ops  # noqa: F401  (loads the C++ operators, registers fake kernels and autograd)
from .torch import FullSoftmaxLoss, HierarchicalSoftmaxLoss, KNNSoftmaxLoss, SampledSoftmaxLoss, Tree

from ._ops import build_info, release_cached_gradients

__version__ = "0.1.0"
__all__ = ["FullSoftmaxLoss", "HierarchicalSoftmaxLoss", "SampledSoftmaxLoss", "KNNSoftmaxLoss", "Tree", "build_info",
           "release_cached_gradients"]
