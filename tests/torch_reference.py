"""Plain torch.nn builds of the shared model descriptions, checked against models/.

Independent of adapters/pytorch.py on purpose: a second, naive reading of the description
(modules in a tree, Caffe's ceil-mode pooling) must agree with the shapes, parameter counts
and buffer counts that models/ infers. Runs inside the PyTorch environment (the launcher's
has no torch), as `python -m tests.torch_reference CHECK MODEL`; prints "ok" or raises.
"""

from __future__ import annotations

import math
import sys

import torch
from torch import nn

from models import (LRN, BatchNorm, Concat, Conv2d, Dropout, Flatten, Linear, Pool2d, ReLU,
                    Residual, Sequential, canonical_weights, get_model)


class Cat(nn.Module):
    def __init__(self, branches):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        return torch.cat([b(x) for b in self.branches], dim=1)


class Add(nn.Module):
    def __init__(self, body, shortcut):
        super().__init__()
        self.body, self.shortcut = body, shortcut

    def forward(self, x):
        return self.body(x) + (x if self.shortcut is None else self.shortcut(x))


def build(spec, device=None):
    """Plain torch.nn modules for `spec`; returns (module, {node name: module})."""
    inputs = {r.name: r.input_shape for r in spec.layer_table()}
    by_name = {}

    def leaf(layer):
        shape = inputs[layer.name]
        if isinstance(layer, Conv2d):
            return nn.Conv2d(shape[0], layer.out_channels, layer.kernel, layer.stride, layer.pad,
                             groups=layer.groups, bias=layer.bias, device=device)
        if isinstance(layer, Linear):
            return nn.Linear(shape[0], layer.out_features, bias=layer.bias, device=device)
        if isinstance(layer, BatchNorm):
            return nn.BatchNorm2d(shape[0], layer.eps, 1 - layer.momentum, device=device)
        if isinstance(layer, Pool2d):
            if layer.global_pool:
                return nn.AdaptiveMaxPool2d(1) if layer.mode == "max" else nn.AdaptiveAvgPool2d(1)
            cls = nn.MaxPool2d if layer.mode == "max" else nn.AvgPool2d
            return cls(layer.kernel, layer.stride, layer.pad, ceil_mode=True)
        if isinstance(layer, LRN):
            return nn.LocalResponseNorm(layer.size, layer.alpha, layer.beta, layer.k)
        if isinstance(layer, Dropout):
            return nn.Dropout(layer.p)
        return {ReLU: nn.ReLU, Flatten: nn.Flatten}[type(layer)]()

    def node_module(node):
        if isinstance(node, Sequential):
            module = nn.Sequential(*[node_module(n) for n in node.layers])
        elif isinstance(node, Concat):
            module = Cat([node_module(b) for b in node.branches])
        elif isinstance(node, Residual):
            module = Add(node_module(node.body), node.shortcut and node_module(node.shortcut))
        else:
            module = leaf(node)
        by_name[node.name] = module
        return module

    return node_module(spec.root), by_name


def check_parameter_count(spec) -> None:
    """Built on the meta device: no memory, no init, just shapes."""
    model, _ = build(spec, device="meta")
    assert sum(p.numel() for p in model.parameters()) == spec.total_params
    buffers = [b for n, b in model.named_buffers() if not n.endswith("num_batches_tracked")]
    assert sum(b.numel() for b in buffers) == sum(
        math.prod(s) for s in spec.buffer_shapes().values())


def check_tiny_forward_backward(spec) -> None:
    """Canonical weights load in torch's own layout; every node's output shape is the one
    models/ infers; a loss backpropagates to every parameter."""
    torch.manual_seed(0)
    model, by_name = build(spec)
    with torch.no_grad():
        for key, array in canonical_weights(spec).items():
            layer, attr = key.rsplit(".", 1)
            target = getattr(by_name[layer], attr)
            assert tuple(target.shape) == array.shape, key  # canonical layout == torch layout
            target.copy_(torch.from_numpy(array))
    seen = {}
    for node_name, module in by_name.items():
        module.register_forward_hook(
            lambda m, i, o, n=node_name: seen.__setitem__(n, tuple(o.shape[1:])))
    x = torch.randn(4, *spec.input_shape)
    logits = model(x)
    assert logits.shape == (4, spec.num_classes)
    assert seen == spec.output_shapes(), "node output shapes differ"  # containers included
    loss = torch.nn.functional.cross_entropy(logits, torch.arange(4) % spec.num_classes)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())


CHECKS = {"parameter_count": check_parameter_count,
          "tiny_forward_backward": check_tiny_forward_backward}

if __name__ == "__main__":
    check, name = sys.argv[1:3]
    CHECKS[check](get_model(name))
    print(f"{check} {name}: ok")
