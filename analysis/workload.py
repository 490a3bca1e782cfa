"""What the performance model needs from a network description (`models/`): its gradient
tensors in the order backward sends them, its layers' FLOPs, and one worker's compute on a
device described by its FLOP rate instead of a measured profile.

Compute from FLOPs (`flops_profile`), for a per-worker batch B on a device that sustains
R = peak x efficiency floating-point operations per second::

    t_f   = B sum_l F_l / R                    F_l: forward FLOPs per sample of layer l
    t_b   = B sum_l w_l / R                    w_l: `perfmodel.backward_weights` (2 F_l for a
                                               layer with parameters, F_l for the first one
                                               and for layers without)
    b_l   = t_b split by w_l (`perfmodel.split_backward_by_flops`), backward order
    t_h2d = B x 4 C H W / host_to_device       float32 images (0 with synthetic data, made on the
                                               device)
    t_u   = 20 P / memory_bandwidth            SGD with momentum per float32 parameter: read
                                               weight, gradient, momentum; write weight and
                                               momentum (5 x 4 bytes); P parameters
    t_io  = 0                                  a prefetching reader keeps up (synthetic data)
"""

from __future__ import annotations

import math
from functools import lru_cache

from analysis import perfmodel as pm
from models import UnknownModel, get_model

BYTES_PER_FLOAT = 4
UPDATE_BYTES_PER_PARAM = 5 * BYTES_PER_FLOAT


@lru_cache(maxsize=32)
def model_tensors(model: str) -> tuple[tuple[str, str, int], ...] | None:
    """(tensor, layer, bytes) in send order (reverse parameter order); None if unknown."""
    try:
        spec = get_model(model)
    except UnknownModel:  # an unknown model gets no prediction, not a crash
        return None
    out = []
    for name, shape in reversed(list(spec.parameter_shapes().items())):
        out.append((name, name.rsplit(".", 1)[0], BYTES_PER_FLOAT * math.prod(shape)))
    return tuple(out)


@lru_cache(maxsize=32)
def model_layer_rows(model: str) -> tuple[tuple[str, int, bool], ...]:
    """(layer, forward FLOPs per sample, has parameters) in forward order."""
    return tuple((row.name, row.flops, row.params > 0) for row in get_model(model).layer_table())


def gradients(model: str, layer_times: list[tuple[str, float]], backward: float,
              bytes_per_value: int = BYTES_PER_FLOAT) -> tuple[pm.Grad, ...]:
    """The model's gradient tensors (send order), each ready when its layer's backward is
    done: layer_times are (layer, seconds) in backward order; a layer missing from them is
    ready at the end of backward.  `bytes_per_value`: 4 for float32 gradients, 2 for a run
    that all-reduces them in half precision."""
    ready, total = {}, 0.0
    for name, seconds in layer_times:
        total += seconds
        ready[name] = total
    return tuple(pm.Grad(name, layer, nbytes * bytes_per_value // BYTES_PER_FLOAT, ready.get(layer, backward))
                 for name, layer, nbytes in model_tensors(model) or ())


def flops_profile(model: str, batch: int, sustained_flops: float, host_to_device: float,
                  memory_bandwidth: float, gradient_bytes: int = BYTES_PER_FLOAT,
                  synthetic: bool = False) -> pm.Profile:
    """One worker's compute of `model` at per-worker `batch` from FLOPs (module docstring);
    rates in FLOP/s and bytes/s; `gradient_bytes` per gradient value sent; `synthetic`: the
    batch is made on the device (no copy, t_h2d = 0).  Raises UnknownModel for a model
    `models/` lacks."""
    spec = get_model(model)
    rows = model_layer_rows(model)
    forward = batch * sum(flops for _, flops, _ in rows) / sustained_flops
    backward = batch * sum(weight for _, weight, _ in pm.backward_weights(rows)) / sustained_flops
    h2d = 0.0 if synthetic else batch * BYTES_PER_FLOAT * math.prod(spec.input_shape) / host_to_device
    update = UPDATE_BYTES_PER_PARAM * spec.total_params / memory_bandwidth
    layer_times = pm.split_backward_by_flops(backward, rows)
    return pm.Profile(0.0, h2d, forward, backward, update,
                      gradients(model, layer_times, backward, gradient_bytes), prefetch=True)


def flops_per_sample(model: str) -> tuple[float, float]:
    """(forward, backward) FLOPs of one sample: sum F_l and sum w_l."""
    rows = model_layer_rows(model)
    return (float(sum(flops for _, flops, _ in rows)),
            float(sum(weight for _, weight, _ in pm.backward_weights(rows))))
