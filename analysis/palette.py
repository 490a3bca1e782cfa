"""One fixed colour per aggregation scheme, so that a scheme looks the same in every figure:
the report's, the what-if's, any campaign's, whatever else a figure happens to show.

Keys are the names people type: the registry's framework names (``torch``, ``tf``,
``mxnet``, ``cntk``, ``cntk-style``, ``caffe-mpi-style``, ``horovod``, ``jax``), the
framework:mode names of the study's schemes (``torch:ddp``, ``tf:collective``, ``tf:ps``,
``mxnet:dist_sync``, ``mxnet:dist_device_sync``, ``horovod:hierarchical`` ...) and the
what-if catalogue's (``no-overlap``, ``wfbp``, ``mgwfbp``, ``buckets``, ``fusion``, ``ps``).
`colour` looks a name up as given, then its framework part (``horovod:gloo`` is Horovod's
colour), and gives any other name a stable colour of the spare list (by a hash of the name,
not by the order names happen to come in).  Standard library only.
"""

from __future__ import annotations

import zlib

# Okabe-Ito / seaborn "colorblind" hues first, darker and lighter companions for a second
# mode of the same framework.
SCHEME_COLOURS: dict[str, str] = {
    "torch": "#0173b2",
    "torch:ddp": "#0173b2",
    "horovod": "#de8f05",
    "horovod:gloo": "#de8f05",
    "horovod:mpi": "#b36b00",
    "horovod:hierarchical": "#8a5200",
    "cntk-style": "#029e73",
    "cntk-style:allreduce": "#029e73",
    "cntk": "#01573f",
    "cntk:mpi": "#01573f",
    "caffe-mpi-style": "#d55e00",
    "caffe-mpi-style:mpi": "#d55e00",
    "tf": "#cc78bc",
    "tf:collective": "#cc78bc",
    "tf:ps": "#8e3f82",
    "tf:ps-async": "#e3b3da",
    "tf:mirrored": "#b25aa3",
    "mxnet": "#ca9161",
    "mxnet:dist_sync": "#ca9161",
    "mxnet:dist_device_sync": "#7f5127",
    "mxnet:local": "#e0c3a4",
    "mxnet:device": "#a87548",
    "mxnet:nccl": "#5c3a1c",
    "jax": "#56b4e9",
    "no-overlap": "#949494",
    "wfbp": "#c8b400",
    "mgwfbp": "#8c8000",
    "buckets": "#1b4f72",
    "fusion": "#f0b25e",
    "ps": "#6b4c9a",
}

SPARE_COLOURS: tuple[str, ...] = ("#fbafe4", "#ece133", "#17becf", "#bcbd22", "#7f7f7f", "#e377c2",
                                  "#8c564b", "#9467bd", "#2ca02c", "#d62728")


def colour(name: str) -> str:
    """The colour of scheme `name` (hex): exact name, else its framework part, else a spare
    colour picked by a stable hash of the name."""
    key = str(name).strip().lower()
    if key in SCHEME_COLOURS:
        return SCHEME_COLOURS[key]
    framework = key.partition(":")[0]
    if framework in SCHEME_COLOURS:
        return SCHEME_COLOURS[framework]
    return SPARE_COLOURS[zlib.crc32(key.encode()) % len(SPARE_COLOURS)]


def colours(names) -> dict[str, str]:
    """{name: colour} for every name of `names`."""
    return {name: colour(name) for name in names}
