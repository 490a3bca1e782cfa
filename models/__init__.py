"""Framework-neutral descriptions of the study's networks (AlexNet, GoogleNet, ResNet-50).

Imports NumPy and the standard library only, so every framework environment can use it.
"""

from .layers import LRN, BatchNorm, Concat, Conv2d, Dropout, Flatten, Linear, Pool2d, ReLU, \
    Residual, Sequential
from .spec import LayerStats, ModelSpec
from .weights import canonical_weights, load_npz, save_npz
from .zoo import MODEL_NAMES, MODELS, ModelFacts, UnknownModel, get_model, model_facts

__all__ = [
    "BatchNorm", "Concat", "Conv2d", "Dropout", "Flatten", "LRN", "LayerStats", "Linear",
    "MODEL_NAMES", "MODELS", "ModelFacts", "ModelSpec", "Pool2d", "ReLU", "Residual", "Sequential", "UnknownModel",
    "canonical_weights", "get_model", "load_npz", "model_facts", "save_npz",
]
